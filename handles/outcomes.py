"""How the end of a run is written down: a result, a failure with its reason, or a cancellation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

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


OPERATOR_PREFIX = "operator:"
"""How a cancel or an answer by an operator (the CLI, the console) is recorded: `operator:<name>`."""

RUNTIME_PREFIX = "handles:"
"""How a cancel the runtime decided is recorded: `handles:<reason>` (`handles:abandoned`)."""

CancelRole = Literal["caller", "operator", "server", "principal"]


def canceller(by: str | None, principal: str) -> tuple[CancelRole, str] | None:
    """Who asked for a job's cancel, as (role, name): role `caller`, `operator`, `server` or `principal`; None if unknown."""
    if by is None:
        return None
    if by == principal:
        return "caller", by
    if by.startswith(OPERATOR_PREFIX):
        return "operator", by.removeprefix(OPERATOR_PREFIX)
    if by.startswith(RUNTIME_PREFIX):
        return "server", by.removeprefix(RUNTIME_PREFIX)
    return "principal", by


def _by_whom(by: str | None, principal: str) -> str:
    """How a caller is told who cancelled: never an operator's name or another principal's."""
    who = canceller(by, principal)
    if who is None:
        return ""
    role, name = who
    if role == "caller":
        return " at the caller's request"
    if role == "operator":
        return " by the server's operator"
    if role == "server" and name == "abandoned":
        return " by the server, since nobody had followed it for its abandon_after time,"
    return " by the server" if role == "server" else " at another caller's request"


def cancelled_message(by: str | None, principal: str, when: str = "") -> str:
    """The status message of a cancelled job: who asked (`canceller`) and, in `when`, at what point it was
    (" before it started", " while it waited for an answer")."""
    return f"Cancelled{_by_whom(by, principal)}{when}".rstrip(",") + "."


def cancelled_at_request(by: str | None, principal: str) -> Outcome:
    """Cancelled at the request of `by` (see `canceller`) and interrupted once the grace period ran out."""
    return Status.CANCELLED, {"status_message": cancelled_message(by, principal)}


def cancelled_with_unknown_steps(steps: list[str], waited: float, by: str | None, principal: str) -> Outcome:
    """Cancelled while durable steps still executed past the limit: their outcome is unknown."""
    names = ", ".join(repr(name) for name in steps)
    message = (
        f"{cancelled_message(by, principal, f' while step {names} was still running')[:-1]}; it did not "
        f"finish within {waited:g} s, so its outcome is unknown. Reconcile it (check whether its effect "
        "happened) before retrying."
    )
    error = {"code": INTERNAL_ERROR, "message": message, "data": {"reason": "step_unknown", "steps": steps}}
    return Status.CANCELLED, {"error": error, "status_message": clean_message(message)}


def result_to_json(result: CallToolResult) -> dict[str, Any]:
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)
