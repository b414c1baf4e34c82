"""The plain tool `<job>`: a job as one ordinary tool with the job's own parameters."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import anyio
from mcp.server.mcpserver import Context
from mcp_types import CallToolResult, InputRequiredResult
from pydantic import BaseModel, Field

from handles.errors import CallerError
from handles.job_operations import JobOperations
from handles.jobs import JobSpec, describe_duration
from handles.outcomes import Outcome
from handles.principal import PrincipalResolver
from handles.server.bind_mcpserver import SdkTool, sdk_function, tool_annotations
from handles.server.endings import cancel_orphaned, ended_answer, outcome_answer, start_call
from handles.server.handle_tools import JobTools
from handles.server.tasks_extension import declares_tasks, missing_tasks_capability
from handles.server.tool_shapes import InputRequestView, ToolReply, input_views, to_call_tool_result
from handles.states import Status
from handles.store import JobRecord
from handles.tasks_wire import TASKS_EXTENSION
from handles.tool_layout import PlainCall, ToolNames, job_meta

ProgressReporter = Callable[[float, float | None, str | None], Awaitable[None]]
"""`(progress, total, message)`: sends `notifications/progress` (a no-op without a progress token)."""


@dataclass(frozen=True)
class PlainCallPolicy:
    """What a call of `<job>` that is no task does: "adaptive" answers the result if the job ends within the
    inline budget, else its handle; "tasks_only" refuses it (`-32021`)."""

    mode: PlainCall = "adaptive"
    inline_budget: timedelta | None = None
    """How long to wait for the result before answering with the handle; None: the configured default."""


class HandoffOutput(BaseModel):
    """The answer of an adaptive call whose job outlived the inline budget (or asked a question)."""

    handle: str = Field(description="Pass this to the progress, fetch, cancel and respond tools.")
    job: str
    status: Status
    status_message: str | None = None
    input_requests: dict[str, InputRequestView] = Field(
        default_factory=dict, description="Questions waiting for an answer, by key."
    )
    poll_after_ms: int
    expires_at: datetime
    next: str = Field(description="What to do next.")


class PlainTool:
    """The plain tool of one job."""

    def __init__(
        self, spec: JobSpec, service: JobOperations, policy: PlainCallPolicy, names: ToolNames | None = None
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.service = service
        self.policy = policy
        self.handle_tools = JobTools(spec, service, names)
        budget = policy.inline_budget
        self.budget_seconds = (
            budget.total_seconds() if budget is not None else service.config.inline_budget_seconds
        )

    @property
    def description(self) -> str:
        spec, tool = self.spec, self.handle_tools.tool
        retention = describe_duration(spec.retention)
        if self.policy.mode == "tasks_only":
            return (
                f"{spec.description}\n\nRuns only as a task: declare the {TASKS_EXTENSION} extension on the "
                f"call, or use {tool('start')} instead and follow the job with {tool('progress')} and "
                f"{tool('fetch')}. Jobs and their results are kept for {retention}."
            )
        return (
            f"{spec.description}\n\nAnswers with the result when the job finishes within about "
            f"{self.budget_seconds:g} s. If it takes longer"
            + (" or needs an answer" if spec.asks_input else "")
            + f", it answers with a handle instead: follow the job with {tool('progress')} and get the "
            f"result with {tool('fetch')}"
            + (f" (answer its questions with {tool('respond')})" if spec.asks_input else "")
            + f". Callers that declare the {TASKS_EXTENSION} extension get a task. Jobs and their results "
            f"are kept for {retention}."
        )

    def sdk_tool(self, resolver: PrincipalResolver) -> SdkTool:
        """This tool as the bindings register it: it starts work, never destructive by itself; its `_meta` says
        its layout, whether the job asks, and what an undeclared call does (a client's manifest)."""
        function = sdk_function(
            self.name, self.spec.metadata.arg_model, resolver, self.handle, CallToolResult
        )
        annotations = tool_annotations(self.spec.name, False, False, False)
        layout = self.handle_tools.names.layout
        meta = job_meta(layout, asks_input=self.spec.asks_input, plain_call=self.policy.mode)
        return SdkTool(function, self.name, self.spec.name, self.description, annotations, meta)

    async def handle(
        self, principal: str, arguments: dict[str, Any], context: Context[Any, Any]
    ) -> CallToolResult | InputRequiredResult:
        """The whole plain call, the same on every framework: refusals, a question asked first, then the job."""
        ctx = context.request_context
        if self.policy.mode == "tasks_only" and not declares_tasks(ctx):
            raise missing_tasks_capability(
                f"{self.name} runs only as a task: declare the {TASKS_EXTENSION} extension on this "
                f"request, or use {self.handle_tools.tool('start')}."
            )
        # An adaptive call waits for the job's result, which a run here hands over once stored.
        settled: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        started = await start_call(
            self.service,
            self.spec,
            principal,
            arguments,
            ctx,
            context.input_responses,
            settled=settled if self.policy.mode == "adaptive" else None,
            face="plain_tool",
        )
        if isinstance(started, CallToolResult | InputRequiredResult):
            return started  # the question before the job, or a refusal
        if self.policy.mode == "tasks_only":
            # A declaring call that gets no task: a tasks-only job's handle goes back at once.
            lead = "No task was created for this call (new tasks are switched off), so this answer is the job's handle. "
            return await self._handoff(started.job, started.handle, lead=lead)
        try:
            job = await self._follow(started.job, context.report_progress, settled)
        except anyio.get_cancelled_exc_class():
            # The caller went away and only this call knew the handle: stop the orphaned job.
            await cancel_orphaned(self.service, started.job)
            raise
        except CallerError:
            job = started.job  # the store faltered while we waited; the job itself is stored and running
        if isinstance(job, tuple):  # the outcome its run here stored
            return outcome_answer(job)
        ended = ended_answer(Status(job.status), job.result, job.error, job.status_message)
        # The handle is signed only now: an answer inline never shows one.
        return ended if ended is not None else await self._handoff(job, started.handle)

    async def _follow(
        self, job: JobRecord, report: ProgressReporter, settled: asyncio.Future[Outcome]
    ) -> JobRecord | Outcome:
        """Wait within the budget for the job to end or park, relaying progress; a draining node stops at once."""
        reported: float | None = None
        async with contextlib.aclosing(self.service.versions(job, self.budget_seconds)) as versions:
            async for job in versions:
                if settled.done():
                    return settled.result()
                status = Status(job.status)
                if status.is_terminal or status is Status.INPUT_REQUIRED:
                    return job
                done = job.progress_done
                if done is not None and (reported is None or done > reported):
                    await report(done, job.progress_total, job.status_message)
                    reported = done
        return settled.result() if settled.done() else job

    async def _handoff(self, job: JobRecord, handle: str, *, lead: str | None = None) -> CallToolResult:
        pending = await self.service.pending_inputs(job)
        if lead is None and Status(job.status) is Status.INPUT_REQUIRED:
            lead = "The job needs an answer before it can go on, so this answer is its handle. "
        elif lead is None and self.service.runtime.closed:
            lead = "This server is shutting down, so this answer is the job's handle instead of its result. "
        elif lead is None:
            lead = f"No result within {self.budget_seconds:g} s, so this answer is the job's handle instead. "
        out = HandoffOutput(
            handle=handle,
            job=self.name,
            status=Status(job.status),
            status_message=job.status_message,
            input_requests=input_views(pending),
            poll_after_ms=self.spec.poll_after_ms,
            expires_at=job.expires_at,
            next=lead
            + self.handle_tools.next_step(job, pending)
            + " Keep the handle: it is the only way back to this job.",
        )
        return to_call_tool_result(ToolReply(out.model_dump(mode="json")))
