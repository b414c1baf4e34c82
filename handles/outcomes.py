"""How the end of a run is written down: a stored result, a failure with its reason, a cancellation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from handles.limits import clean_message
from handles.states import Status

if TYPE_CHECKING:  # the store imports this module; the operator's CLI loads no MCP types through it
    from mcp_types import CallToolResult

INTERNAL_ERROR = -32603

Outcome = tuple[Status, dict[str, Any]]


def failed(message: str, reason: str, **data: Any) -> Outcome:
    """A `failed` outcome: the JSON-RPC error object the Tasks face returns, and the status message."""
    message = clean_message(message, 2000) or "The job failed."
    error = {"code": INTERNAL_ERROR, "message": message, "data": {"reason": reason, **data}}
    return Status.FAILED, {"error": error, "status_message": clean_message(message)}


def cancelled_at_request() -> Outcome:
    """Cancelled by its caller (or an operator) and interrupted once the grace period ran out."""
    return Status.CANCELLED, {"status_message": "Cancelled at the caller's request."}


def cancelled_with_unknown_steps(steps: list[str], waited: float) -> Outcome:
    """Cancelled while durable steps still executed past the limit: their outcome is unknown."""
    names = ", ".join(repr(name) for name in steps)
    message = (
        f"Cancelled at the caller's request while step {names} was still running; it did not finish within "
        f"{waited:g} s, so its outcome is unknown. Reconcile it (check whether its effect happened) before "
        "retrying."
    )
    error = {"code": INTERNAL_ERROR, "message": message, "data": {"reason": "step_unknown", "steps": steps}}
    return Status.CANCELLED, {"error": error, "status_message": clean_message(message)}


def result_to_json(result: CallToolResult) -> dict[str, Any]:
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)
