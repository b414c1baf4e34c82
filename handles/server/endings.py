"""A job's ending answered inline, as an ordinary tool call would answer it, on every face that waits for it."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, CallToolResult, TextContent

from handles.outcomes import Outcome
from handles.states import Status
from handles.store import JobRecord

if TYPE_CHECKING:
    from handles.job_operations import JobOperations

logger = logging.getLogger("handles.server.endings")


def ended_answer(
    status: Status, result: dict[str, Any] | None, error: dict[str, Any] | None, message: str | None
) -> CallToolResult | None:
    """The answer of a job that ended (a failed job's is its JSON-RPC error, raised), else None."""
    if status is Status.COMPLETED and result is not None:
        return CallToolResult.model_validate(result)
    if status is Status.FAILED:
        error = error or {}
        raise MCPError(
            code=int(error.get("code", INTERNAL_ERROR)),
            message=str(error.get("message") or message or "The job failed."),
            data=error.get("data"),
        )
    if status is Status.CANCELLED:
        return CallToolResult(
            content=[TextContent(type="text", text=message or "The job was cancelled.")], is_error=True
        )
    return None


def outcome_answer(outcome: Outcome) -> CallToolResult:
    """The answer of the outcome a job's run in this process stored (always an ending)."""
    status, values = outcome
    ended = ended_answer(status, values.get("result"), values.get("error"), values.get("status_message"))
    assert ended is not None, "a stored outcome is terminal"
    return ended


async def cancel_orphaned(service: JobOperations, job: JobRecord) -> None:
    """Cancel a job whose only caller went away before it learned the job's handle or task id. Shielded:
    it runs while that caller's request is being cancelled."""
    with anyio.CancelScope(shield=True):
        try:
            await service.cancel(job)
        except Exception:
            logger.warning("could not cancel job %s after its caller went away", job.id, exc_info=True)
