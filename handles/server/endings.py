"""What a plain `<job>` call (or a task-creating one) answers before its job exists, and once the job ended."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    CallToolResult,
    ElicitRequest,
    ElicitRequestFormParams,
    InputRequiredResult,
    TextContent,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from handles.ask_first import FIRST_KEY
from handles.errors import CallerError
from handles.outcomes import Outcome
from handles.server.tool_shapes import refusal
from handles.states import Status
from handles.store import JobRecord

if TYPE_CHECKING:
    from handles.job_operations import JobOperations, StartedJob
    from handles.jobs import JobSpec

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


async def start_call(
    service: JobOperations,
    spec: JobSpec,
    principal: str,
    arguments: dict[str, Any],
    ctx: ServerRequestContext[Any, Any],
    responses: Mapping[str, Any] | None,
    *,
    settled: asyncio.Future[Outcome] | None,
    face: str,
) -> StartedJob | CallToolResult | InputRequiredResult:
    """A plain `<job>` call's (or a task-creating one's) job started, or what the call answers instead: the
    question before the job, or a refusal (a paused job kind's before any question is asked about it)."""
    try:
        await service.check_accepting(spec)
        answer = None
        # The question goes in-band (an `InputRequiredResult`) to a 2026-07-28 request with elicitation only.
        capabilities = ctx.session.client_capabilities
        if (
            spec.ask_first is not None
            and ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
            and capabilities
            and capabilities.elicitation
        ):
            response = (responses or {}).get(FIRST_KEY)
            if response is None:
                values = spec.validate_arguments(arguments, f"Fix the arguments and call {spec.name} again.")
                request = ElicitRequest(
                    params=ElicitRequestFormParams(
                        message=spec.ask_first.render(values),
                        requested_schema=spec.ask_first.requested_schema(),
                    )
                )
                return InputRequiredResult(input_requests={FIRST_KEY: request})
            action = getattr(response, "action", None)  # an `ElicitResult`, or another kind of answer
            if action != "accept":
                text = f"{spec.name} was not started: the question before it was {action or 'not answered'}."
                return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)
            content = getattr(response, "content", None)
            answer = dict(content) if isinstance(content, Mapping) else {}
        return await service.start(
            spec, principal, arguments, None, first_answer=answer, settled=settled, face=face
        )
    except CallerError as error:
        return refusal(error)
