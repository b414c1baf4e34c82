"""A job's handle tools: `<job>_start` and its follow tools (or the compact layout's shared `jobs_*` ones),
each a framework-neutral `ToolDefinition` whose every reply says what to call next (`next`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Optional

from pydantic import Field, create_model

from handles.job_operations import JobOperations
from handles.jobs import JobSpec, describe_duration
from handles.liveness import LeaseTiming
from handles.results import link_of, link_size_text, tool_error_text
from handles.server.follow_tools import FollowScope, follow_definitions
from handles.server.next_steps import JobGuidance
from handles.server.reply_memo import ReplyMemo
from handles.server.tool_shapes import (
    CancelOutput,
    ErrorView,
    ProgressOutput,
    ProgressView,
    RespondOutput,
    StartOutput,
    StepView,
    ToolDefinition,
    ToolHandler,
    ToolReply,
    fetch_model,
    guarded,
    input_views,
)
from handles.states import Status
from handles.store import JobRecord, JobState
from handles.tool_layout import FOLLOW_VERBS, SHARED_PREFIX, ToolNames


class JobTools(JobGuidance):
    """The handle tools of one job, named as the layout says (`names`)."""

    def __init__(self, spec: JobSpec, service: JobOperations, names: ToolNames | None = None) -> None:
        super().__init__(
            spec, names or ToolNames(), service.config.max_wait_seconds, LeaseTiming.of(service.config)
        )
        self.service = service
        self._progress_replies: ReplyMemo[ToolReply] = ReplyMemo()
        result_type: Any = spec.metadata.output_model
        self.fetch_model = fetch_model(
            f"{spec.name}_fetch_output",
            Optional[result_type],  # noqa: UP045 - a runtime type expression
            f"The {spec.name} result, once completed.",
        )

    async def start(self, principal: str, arguments: dict[str, Any]) -> ToolReply:
        arguments = dict(arguments)
        key = arguments.pop("idempotency_key", None)
        started = await self.service.start(self.spec, principal, arguments, key, face="handle_tools")
        job = started.job
        pending = await self.service.pending_inputs(job)
        if pending:
            advice = (
                "The job is stored but does not start until you answer. " if started.created else ""
            ) + (self.next_step(job, pending) + " Keep the handle: it is the only way back to this job.")
        elif started.created:
            advice = (
                f"The job has started. Call {self.tool('progress')} with this handle in about "
                f"{self.poll_seconds:g} s (or with wait_seconds up to {int(self.max_wait)} "
                f"to wait for a change), and {self.tool('fetch')} for the result once it is completed. "
                "Keep the handle: it is the only way back to this job."
            )
        else:
            advice = (
                "This idempotency_key already started this job; no new job was started. Follow it with "
                f"{self.tool('progress')} and {self.tool('fetch')}."
            )
        out = StartOutput(
            handle=started.handle,
            job=self.spec.name,
            status=Status(job.status),
            status_message=job.status_message,
            created=started.created,
            poll_after_ms=self.spec.poll_after_ms,
            expires_at=job.expires_at,
            input_requests=input_views(pending),
            next=advice,
        )
        return ToolReply(out.model_dump(mode="json"))

    async def progress(self, principal: str, arguments: dict[str, Any]) -> ToolReply:
        view = await self.service.open_view(self.spec, principal, arguments.get("handle"))
        opened = view.job
        # Wait only while the job works on its own: one waiting for the caller's answer, or ended, is
        # reported at once (the caller may not have seen it get there; waiting would only stall them).
        if _seconds(arguments) > 0 and opened.status == Status.WORKING:
            latest = await self.service.wait(
                opened,
                _seconds(arguments),
                lambda j: j.version != opened.version or Status(j.status) is not Status.WORKING,
            )
            view = await self.service.view(latest)
        job = view.job
        quiet = self._quiet_node(job)
        # The reply is made from the job's state and its steps' alone: an unchanged job's is the last one.
        # A job waiting for answers is not remembered (its questions are read apart from its state), nor one
        # whose node has gone quiet (its reply says for how long); while the node is alive, a renewal of its
        # lease changes nothing the reply shows.
        state = None if view.pending or quiet else (replace(job, lease_expires_at=None), view.steps)
        if state is not None:
            last = self._progress_replies.get(job.id, state)
            if last is not None:
                return last
        out = ProgressOutput(
            job=self.spec.name,
            status=Status(job.status),
            status_message=job.status_message if quiet is None else self._quiet_status(job, quiet),
            progress=_progress(job),
            input_requests=input_views(view.pending),
            attempts=job.attempts,
            steps=[StepView.model_validate(step, from_attributes=True) for step in view.steps],
            created_at=job.created_at,
            updated_at=job.updated_at,
            expires_at=job.expires_at,
            poll_after_ms=None if Status(job.status).is_terminal else self.spec.poll_after_ms,
            next=self.next_step(job, view.pending) if quiet is None else self._quiet_next(job, quiet),
        )
        reply = ToolReply(out.model_dump(mode="json"))
        if state is not None:
            self._progress_replies.put(job.id, state, reply)
        return reply

    async def fetch(self, principal: str, arguments: dict[str, Any]) -> ToolReply:
        job = await self.service.open(self.spec, principal, arguments.get("handle"))
        job = await self.service.wait(job, _seconds(arguments), _fetchable, past_reports=True)
        status = Status(job.status)
        pending = await self.service.pending_inputs(job)
        fields: dict[str, Any] = {
            "job": self.spec.name,
            "status": status,
            "status_message": job.status_message,
            "expires_at": job.expires_at,
            "poll_after_ms": None if status.is_terminal else self.spec.poll_after_ms,
            "next": self.next_step(job, pending, fetching=True),
        }
        is_error = False
        if status is Status.COMPLETED and job.result is not None:
            if job.result.get("isError"):
                is_error = True
                fields["tool_error"] = tool_error_text(job.result)
            else:
                fields["result"] = job.result.get("structuredContent")
                link = link_of(job.result)
                if link is not None:
                    fields["result_link"] = link
                    declared = job.result.get("structuredContent") is not None  # a ResultFile job's link
                    fields["next"] = (
                        f"The job is finished; its result is {link_size_text(link, declared=declared)} "
                        f"{link.read_hint} It stays available until {job.expires_at.isoformat()}."
                    )
        elif status is Status.FAILED:
            is_error = True
            fields["error"] = ErrorView.model_validate(
                job.error or {"code": -32603, "message": "The job failed."}
            )
        elif not status.is_terminal:
            fields["next"] = "The result is not ready yet. " + fields["next"]
        out = self.fetch_model.model_validate(fields)
        return ToolReply(out.model_dump(mode="json"), is_error=is_error, link=fields.get("result_link"))

    async def cancel(self, principal: str, arguments: dict[str, Any]) -> ToolReply:
        job = await self.service.open(self.spec, principal, arguments.get("handle"))
        before = Status(job.status)
        job = await self.service.cancel(job)
        status = Status(job.status)
        if before.is_terminal:
            advice = f"The job had already ended ({status}); cancelling changed nothing."
        elif status is Status.CANCELLED:
            advice = "The job is cancelled. It will not produce a result."
        else:
            advice = (
                "Cancellation was requested; the job stops at its next safe point. It may still finish first. "
                f"Call {self.tool('progress')} with this handle to see its final status."
            )
        out = CancelOutput(
            job=self.spec.name,
            status=status,
            status_message=job.status_message,
            cancel_requested=job.cancel_requested_at is not None,
            next=advice,
        )
        return ToolReply(out.model_dump(mode="json"))

    async def respond(self, principal: str, arguments: dict[str, Any]) -> ToolReply:
        job = await self.service.open(self.spec, principal, arguments.get("handle"))
        responses = arguments.get("responses") or {}
        outcome = await self.service.respond(
            self.spec, job, responses, again=self.tool("respond"), follow=self.tool("progress")
        )
        pending = await self.service.pending_inputs(outcome.job)
        out = RespondOutput(
            job=self.spec.name,
            status=Status(outcome.job.status),
            accepted=outcome.accepted,
            ignored=outcome.ignored,
            input_requests=input_views(pending),
            next=self.next_step(outcome.job, pending),
        )
        return ToolReply(out.model_dump(mode="json"))

    def definitions(self) -> list[ToolDefinition]:
        """`<job>_start`, and this job's own follow tools unless the layout shares them (compact)."""
        spec = self.spec
        retention = describe_duration(spec.retention)
        start_input = create_model(
            f"{spec.name}_start_input",
            __base__=spec.metadata.arg_model,
            idempotency_key=(
                Optional[str],  # noqa: UP045
                Field(
                    None,
                    description=(
                        "Optional. Reusing a key with the same arguments returns the same job instead of "
                        "starting another (safe retries after a lost connection)."
                    ),
                ),
            ),
        )
        start = ToolDefinition(
            name=self.tool("start"),
            title=f"Start {spec.name}",
            description=(
                f"{spec.description}\n\nStarts this as a background job and answers at once with a handle. "
                f"Follow it with {self.tool('progress')} and get the result with {self.tool('fetch')}"
                + (f"; answer its questions with {self.tool('respond')}" if spec.asks_input else "")
                + f". Jobs and their results are kept for {retention}; after that the handle expires."
            ),
            input_model=start_input,
            output_model=StartOutput,
            handler=guarded(self.start),
            read_only=False,
            idempotent=False,
        )
        if self.names.shared:
            return [start]
        scope = FollowScope(
            names=self.names,
            job=spec.name,
            label=spec.name,
            subject=f"a {spec.name} job",
            started=f"started with {self.tool('start')}",
            running=f"a running {spec.name} job",
            expiry=f"Handles expire {retention} after the job started.",
            kept=f"Results are kept for {retention} after the job started.",
            max_wait=self.max_wait,
        )
        handlers = {verb: getattr(self, verb) for verb in FOLLOW_VERBS}
        return [start, *follow_definitions(scope, handlers, self.fetch_model, asks_input=spec.asks_input)]


class SharedTools:
    """The compact layout's `jobs_*` follow tools: each verifies the handle, then answers as its job's own tool would."""

    def __init__(self, tools: Mapping[str, JobTools], service: JobOperations, names: ToolNames) -> None:
        self.tools = dict(tools)
        self.service = service
        self.names = names
        self.fetch_model = fetch_model(
            f"{names.name(SHARED_PREFIX, 'fetch')}_output",
            Any,
            "The job's result once completed, shaped as that job's own result (see job).",
        )

    def _dispatch(self, verb: str) -> ToolHandler:
        async def dispatch(principal: str, arguments: dict[str, Any]) -> ToolReply:
            spec = await self.service.spec_of(principal, arguments.get("handle"))
            handler: ToolHandler = getattr(self.tools[spec.name], verb)
            return await handler(principal, arguments)

        return dispatch

    def definitions(self) -> list[ToolDefinition]:
        scope = FollowScope(
            names=self.names,
            job=SHARED_PREFIX,
            label="job",
            subject="a job",
            started="started with any *_start tool (the handle says which job)",
            running="a running job of any kind",
            expiry="Handles expire when their job's retention ends (each *_start tool states it).",
            kept="Results are kept for their job's retention (each *_start tool states it).",
            max_wait=self.service.config.max_wait_seconds,
        )
        handlers = {verb: self._dispatch(verb) for verb in FOLLOW_VERBS}
        asks = any(tools.spec.asks_input for tools in self.tools.values())
        return follow_definitions(scope, handlers, self.fetch_model, asks_input=asks)


def _seconds(arguments: dict[str, Any]) -> float:
    return float(arguments.get("wait_seconds") or 0)


def _fetchable(job: JobRecord) -> bool:
    """What a fetch waits for: the job's end, or a question for the caller (not one of a job on its way to
    `cancelled`: asked to cancel while a worker still holds it)."""
    status = Status(job.status)
    if status is Status.WORKING:
        return False
    return status.is_terminal or job.cancel_requested_at is None or job.lease_owner is None


def _progress(job: JobRecord | JobState) -> ProgressView:
    fraction = None
    if job.progress_done is not None and job.progress_total:
        fraction = max(0.0, min(1.0, job.progress_done / job.progress_total))
    return ProgressView(done=job.progress_done, total=job.progress_total, fraction=fraction)
