"""The generator: one job in, its handle tools out (names, descriptions, schemas, handlers).

`JobTools` makes a job's `<job>_start` and, in the per-job layout, its follow tools;
`SharedTools` makes the compact layout's `jobs_*` follow tools, which hand each handle to
the `JobTools` of its job. Both build the follow tools with `follow_definitions`, told whose
handles they take by a `FollowScope`, and name every tool through `handles.tool_layout.ToolNames`.

Framework-neutral: a `ToolDefinition` carries pydantic models for its input and
output and an async handler `(principal, arguments) -> ToolReply`. `handles.server.bind_mcpserver`
binds these to the SDK's server. Every reply says what to call next (`next`),
because the caller is often a language model that would otherwise guess.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Optional

from pydantic import BaseModel, Field, create_model

from handles.errors import CallerError, UnknownHandle
from handles.job_operations import UNKNOWN_HANDLE, JobOperations
from handles.jobs import JobSpec, describe_duration
from handles.liveness import LeaseTiming, NodeContact, clock_time, node_contact
from handles.results import ResultLink, link_of, link_size_text, tool_error_text
from handles.server.output_schema import FlatSchemaModel
from handles.server.reply_memo import ReplyMemo
from handles.states import Status
from handles.store import InputRequestRecord, JobRecord, JobState
from handles.tool_layout import FOLLOW_VERBS, SHARED_PREFIX, ToolNames

HANDLE_DESCRIPTION = "The handle string returned by the start tool, exactly as given."


# -- output models -------------------------------------------------------------


class ProgressView(BaseModel):
    done: float | None = Field(None, description="Units of work done so far, as reported by the job.")
    total: float | None = Field(None, description="Total units of work, when the job knows it.")
    fraction: float | None = Field(None, description="done / total between 0 and 1, when both are known.")


class InputRequestView(BaseModel):
    message: str = Field(description="The question, for a person or for you to answer.")
    requested_schema: dict[str, Any] = Field(
        description="JSON schema of the answer: an object of primitive fields."
    )


class StepView(BaseModel):
    name: str
    status: str = Field(description="started (outcome not yet recorded), completed, or failed.")
    attempt: int
    started_at: datetime
    finished_at: datetime | None = None


class ErrorView(BaseModel):
    code: int
    message: str
    data: dict[str, Any] | None = None


class StartOutput(FlatSchemaModel):
    handle: str = Field(description="Pass this to the progress, fetch, cancel and respond tools.")
    job: str
    status: Status
    status_message: str | None = None
    created: bool = Field(
        description="False when an earlier start with the same idempotency_key is returned."
    )
    poll_after_ms: int = Field(description="Wait at least this long before checking progress.")
    expires_at: datetime = Field(description="When the job and its result are deleted.")
    input_requests: dict[str, InputRequestView] = Field(
        default_factory=dict,
        description="Questions the job needs answered before it starts, by key (answer with the respond tool).",
    )
    next: str = Field(description="What to do next.")


class ProgressOutput(FlatSchemaModel):
    job: str
    status: Status
    status_message: str | None = None
    progress: ProgressView
    input_requests: dict[str, InputRequestView] = Field(
        default_factory=dict,
        description="Questions waiting for an answer, by key (answer with the respond tool).",
    )
    attempts: int = Field(
        0, description="How many times the job has been started (more than 1 after a retry)."
    )
    steps: list[StepView] = Field(
        default_factory=list, description="The job's durable steps so far (names and outcomes, not values)."
    )
    created_at: datetime
    updated_at: datetime
    expires_at: datetime
    poll_after_ms: int | None = Field(None, description="When to check again; null once the job has ended.")
    next: str


class CancelOutput(FlatSchemaModel):
    job: str
    status: Status
    status_message: str | None = None
    cancel_requested: bool
    next: str


class RespondOutput(FlatSchemaModel):
    job: str
    status: Status
    accepted: list[str] = Field(description="Keys whose answers were recorded.")
    ignored: list[str] = Field(
        description="Keys that were unknown or already answered; nothing was changed for them."
    )
    input_requests: dict[str, InputRequestView] = Field(default_factory=dict)
    next: str


class FetchOutputBase(FlatSchemaModel):
    job: str
    status: Status
    status_message: str | None = None
    error: ErrorView | None = Field(None, description="Why the job failed, when it failed.")
    tool_error: str | None = Field(
        None, description="The job's own error message, when it ended in a tool error."
    )
    result_link: ResultLink | None = Field(None, description="The result, when too large to show here.")
    poll_after_ms: int | None = None
    expires_at: datetime
    next: str


# -- definitions -----------------------------------------------------------------


@dataclass(frozen=True)
class ToolReply:
    """A tool's answer: structured content (conforming to the output model) or a caller error."""

    structured: dict[str, Any]
    is_error: bool = False
    link: ResultLink | None = None
    """A large result's link, also given as a `resource_link` content item."""

    @functools.cached_property
    def text(self) -> str:
        """The structured content as JSON text (made once: a progress reply may be reused, `ReplyMemo`)."""
        return json.dumps(self.structured, ensure_ascii=False, default=str)


ToolHandler = Callable[[str, dict[str, Any]], Awaitable[ToolReply]]


@dataclass(frozen=True)
class ToolDefinition:
    name: str
    title: str
    description: str
    input_model: type[BaseModel]
    output_model: type[BaseModel]
    handler: ToolHandler
    read_only: bool
    destructive: bool = False
    idempotent: bool = True


def error_reply(error: CallerError) -> ToolReply:
    return ToolReply(structured=error.to_dict(), is_error=True)


def _guarded(handler: ToolHandler) -> ToolHandler:
    async def guarded(principal: str, arguments: dict[str, Any]) -> ToolReply:
        try:
            return await handler(principal, arguments)
        except CallerError as error:
            return error_reply(error)

    return guarded


class JobTools:
    """The handle tools of one job, named as the layout says (`names`)."""

    def __init__(self, spec: JobSpec, service: JobOperations, names: ToolNames | None = None) -> None:
        self.spec = spec
        self.service = service
        self.names = names or ToolNames()
        self.max_wait = service.config.max_wait_seconds
        self._progress_replies: ReplyMemo[ToolReply] = ReplyMemo()
        self.lease_timing = LeaseTiming.of(service.config)
        self._quiet_margin = self.lease_timing.quiet_margin
        result_type: Any = spec.metadata.output_model
        self.fetch_model: type[FetchOutputBase] = create_model(
            f"{spec.name}_fetch_output",
            __base__=FetchOutputBase,
            result=(
                Optional[result_type],  # noqa: UP045 - a runtime type expression
                Field(None, description=f"The {spec.name} result, once completed."),
            ),
        )

    # -- names and guidance ------------------------------------------------

    def tool(self, verb: str) -> str:
        """The name of this job's `verb` tool in the layout (`<job>_progress` or the shared `jobs_progress`)."""
        return self.names.name(self.spec.name, verb)

    @property
    def poll_after_ms(self) -> int:
        return int(self.spec.poll_after.total_seconds() * 1000)

    def next_step(
        self, job: JobRecord | JobState, pending: list[InputRequestRecord], *, fetching: bool = False
    ) -> str:
        status = Status(job.status)
        if status is Status.WORKING:
            return self._still_running
        if status is Status.INPUT_REQUIRED:
            keys = ", ".join(r.key for r in pending) or "the pending keys"
            example = json.dumps({r.key: {"...": "..."} for r in pending[:1]} or {"q1": {"...": "..."}})
            return (
                f"The job is waiting for an answer to {keys}. Read input_requests, then call "
                f"{self.tool('respond')} with this handle and responses like {example} (one object per key, "
                f"fields as in its requested_schema); then keep following the job with {self.tool('progress')}."
            )
        if status is Status.COMPLETED:
            until = job.expires_at.isoformat()
            if fetching:
                return f"The job is finished and this is its result. Nothing more to do; it stays available until {until}."
            return f"The job is finished. Call {self.tool('fetch')} with this handle to get the result (kept until {until})."
        if status is Status.FAILED and _reason(job) == "server_configuration":
            return (
                "The job failed because of the server's configuration, not because of your request; see "
                "error. Starting it again fails the same way: tell the server's operator the reference in "
                "error, and start it again once they have fixed it."
            )
        if status is Status.FAILED:
            return (
                "The job failed and will not produce a result; see error. Do not retry blindly: check whether "
                f"anything it started must be reconciled, then start a new job with {self.tool('start')} if needed."
            )
        if _reason(job) == "step_unknown":
            return (
                "The job was cancelled while a step was still running, and that step's outcome is unknown (see "
                "status_message). Reconcile it (check whether its effect happened) before starting a new job "
                f"with {self.tool('start')}."
            )
        return (
            "The job was cancelled and will not produce a result. Start a new job with "
            f"{self.tool('start')} if you still need it."
        )

    @functools.cached_property
    def _still_running(self) -> str:
        """`next_step` of a job still working: the same for every poll of this job kind, so made once."""
        seconds = self._poll_seconds
        wait_hint = f"set wait_seconds (up to {int(self.max_wait)}) to wait for the change instead of polling"
        return (
            f"The job is still running. Call {self.tool('progress')} with this handle in about "
            f"{seconds:g} s ({wait_hint}), or {self.tool('fetch')} with wait_seconds to wait for the result."
        )

    def _quiet_node(self, job: JobState) -> NodeContact | None:
        """What the job's lease tells of its node, once the node has gone quiet (None before: a poll of a
        healthy job pays one comparison)."""
        lease_end, now = job.lease_expires_at, datetime.now(UTC)
        if lease_end is None or now <= lease_end - self._quiet_margin:
            return None
        contact = node_contact(job.status, lease_end, now, self.lease_timing)
        return contact if contact is not None and contact.quiet else None

    def _quiet_status(self, job: JobState, quiet: NodeContact) -> str:
        """The status message of a job whose server has gone quiet: the job's own, then how long and until when
        (never which server: a caller is not told where its job runs)."""
        own = f"{job.status_message} " if job.status_message else ""
        takeover = (
            "another server takes the job over as soon as one is running"
            if quiet.takeover_overdue
            else f"another server takes the job over by {clock_time(quiet.takeover_by)}"
        )
        return (
            f"{own}(The server running this job has not been heard from for {quiet.silent_seconds:.0f} s; "
            f"{takeover}.)"
        )

    def _quiet_next(self, job: JobState, quiet: NodeContact) -> str:
        """`next` for a job whose server has gone quiet: keep following it, do not start it again."""
        when = (
            "as soon as one is running" if quiet.takeover_overdue else f"by {clock_time(quiet.takeover_by)}"
        )
        then = (
            "runs it again (steps it already recorded are not repeated)"
            if self.spec.on_interrupt == "retry" and job.attempts < self.spec.max_attempts
            else "ends it as failed (this job is not run again after an interruption), and its reply will say so"
        )
        return (
            f"The server running this job has not been heard from for {quiet.silent_seconds:.0f} s (it may have "
            f"stopped). Nothing is lost: another server takes the job over {when} and {then}. Do not start a new "
            f"job; keep calling {self.tool('progress')} with this handle in about {self._poll_seconds:g} s (or "
            f"with wait_seconds up to {int(self.max_wait)} to wait for the change)."
        )

    @property
    def _poll_seconds(self) -> float:
        return max(self.spec.poll_after.total_seconds(), 0.1)

    def _requests(self, pending: list[InputRequestRecord]) -> dict[str, InputRequestView]:
        return {
            r.key: InputRequestView(message=r.message, requested_schema=r.requested_schema) for r in pending
        }

    # -- handlers ----------------------------------------------------------

    async def start(self, principal: str, arguments: dict[str, Any]) -> ToolReply:
        arguments = dict(arguments)
        key = arguments.pop("idempotency_key", None)
        started = await self.service.start(self.spec, principal, arguments, key)
        job = started.job
        pending = await self.service.pending_inputs(job)
        if pending:
            advice = (
                "The job is stored but does not start until you answer. " if started.created else ""
            ) + (self.next_step(job, pending) + " Keep the handle: it is the only way back to this job.")
        elif started.created:
            advice = (
                f"The job has started. Call {self.tool('progress')} with this handle in about "
                f"{self.spec.poll_after.total_seconds():g} s (or with wait_seconds up to {int(self.max_wait)} "
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
            poll_after_ms=self.poll_after_ms,
            expires_at=job.expires_at,
            input_requests=self._requests(pending),
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
        # whose node has gone quiet (its reply says for how long).
        state = None if view.pending or quiet else (job, view.steps)
        if state is not None:
            last = self._progress_replies.get(job.id, state)
            if last is not None:
                return last
        out = ProgressOutput(
            job=self.spec.name,
            status=Status(job.status),
            status_message=job.status_message if quiet is None else self._quiet_status(job, quiet),
            progress=_progress(job),
            input_requests=self._requests(view.pending),
            attempts=job.attempts,
            steps=[
                StepView(
                    name=step.name,
                    status=step.status,
                    attempt=step.attempt,
                    started_at=step.started_at,
                    finished_at=step.finished_at,
                )
                for step in view.steps
            ],
            created_at=job.created_at,
            updated_at=job.updated_at,
            expires_at=job.expires_at,
            poll_after_ms=None if Status(job.status).is_terminal else self.poll_after_ms,
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
            "poll_after_ms": None if status.is_terminal else self.poll_after_ms,
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
            input_requests=self._requests(pending),
            next=self.next_step(outcome.job, pending),
        )
        return ToolReply(out.model_dump(mode="json"))

    # -- definitions ---------------------------------------------------------

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
            handler=_guarded(self.start),
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
        handlers = {
            "progress": self.progress,
            "fetch": self.fetch,
            "cancel": self.cancel,
            "respond": self.respond,
        }
        return [start, *follow_definitions(scope, handlers, self.fetch_model, asks_input=spec.asks_input)]


class SharedTools:
    """The compact layout's `jobs_progress`, `jobs_fetch`, `jobs_cancel` and `jobs_respond`.

    Each call verifies the handle first (signature, principal) and hands it to the tools of the job its
    signed kind names, so it gets exactly what that job's own tool would answer. A handle that does not
    verify, another principal's included, and one of a job not declared here are refused alike.
    """

    def __init__(self, tools: Mapping[str, JobTools], service: JobOperations, names: ToolNames) -> None:
        self.tools = dict(tools)
        self.service = service
        self.names = names
        self.fetch_model: type[FetchOutputBase] = create_model(
            f"{names.name(SHARED_PREFIX, 'fetch')}_output",
            __base__=FetchOutputBase,
            result=(
                Any,
                Field(
                    None,
                    description="The job's result once completed, shaped as that job's own result (see job).",
                ),
            ),
        )

    def _starts(self) -> str:
        return ", ".join(tools.tool("start") for tools in self.tools.values())

    def unknown_handle(self) -> UnknownHandle:
        return UnknownHandle(
            UNKNOWN_HANDLE,
            f"Pass the exact handle string that a start tool ({self._starts()}) returned, or start a new job "
            "with one of them.",
        )

    def _dispatch(self, verb: str) -> ToolHandler:
        async def dispatch(principal: str, arguments: dict[str, Any]) -> ToolReply:
            spec = await self.service.spec_of(principal, arguments.get("handle"), self.unknown_handle())
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


@dataclass(frozen=True)
class FollowScope:
    """Whose handles a set of follow tools takes, in the words their names and descriptions use."""

    names: ToolNames
    job: str
    label: str
    subject: str
    started: str
    running: str
    expiry: str
    kept: str
    max_wait: float

    def tool(self, verb: str) -> str:
        return self.names.name(self.job, verb)


def follow_definitions(
    scope: FollowScope,
    handlers: Mapping[str, ToolHandler],
    fetch_model: type[BaseModel],
    *,
    asks_input: bool,
) -> list[ToolDefinition]:
    """The progress, fetch, cancel (and respond) tools of one job, or the shared ones of every job."""
    wait_field = (
        float,
        Field(
            0,
            ge=0,
            description=(
                f"Seconds to wait for a change before answering (0 answers at once; at most "
                f"{int(scope.max_wait)}). Waiting is cheaper than polling often."
            ),
        ),
    )
    handle_field = (str, Field(description=HANDLE_DESCRIPTION))
    tool = scope.tool
    defs = [
        ToolDefinition(
            name=tool("progress"),
            title=f"{scope.label} progress",
            description=(
                f"Status and progress of {scope.subject} {scope.started}: "
                "working, input_required, completed, failed or cancelled, with any questions waiting "
                f"for an answer. {scope.expiry}"
            ),
            input_model=create_model(
                f"{tool('progress')}_input", handle=handle_field, wait_seconds=wait_field
            ),
            output_model=ProgressOutput,
            handler=_guarded(handlers["progress"]),
            read_only=True,
        ),
        ToolDefinition(
            name=tool("fetch"),
            title=f"{scope.label} result",
            description=(
                f"The result of {scope.subject} {scope.started}, once completed. "
                "Before that it reports the status and never invents a result; with wait_seconds it "
                f"waits for the job to finish. {scope.kept}"
            ),
            input_model=create_model(f"{tool('fetch')}_input", handle=handle_field, wait_seconds=wait_field),
            output_model=fetch_model,
            handler=_guarded(handlers["fetch"]),
            read_only=True,
        ),
        ToolDefinition(
            name=tool("cancel"),
            title=f"Cancel {scope.label}",
            description=(
                f"Ask {scope.running} to stop. Safe to repeat; cancelling a finished job changes "
                "nothing and reports its final status."
            ),
            input_model=create_model(f"{tool('cancel')}_input", handle=handle_field),
            output_model=CancelOutput,
            handler=_guarded(handlers["cancel"]),
            read_only=False,
            destructive=True,
        ),
    ]
    if asks_input:
        defs.append(
            ToolDefinition(
                name=tool("respond"),
                title=f"Answer {scope.label}",
                description=(
                    f"Answer the questions {scope.subject} is waiting on (status input_required). "
                    "responses maps each question key from input_requests to an object of the requested "
                    "fields. Keys already answered, and unknown keys beside an answer, are ignored; a reply "
                    "that answers no question the job asked is refused, naming the open ones. The fields "
                    f"of each question are its requested_schema, in input_requests of the {tool('progress')} reply; an answer "
                    "is checked against it, and one of the wrong shape is refused (saying what was "
                    "expected) with nothing stored."
                ),
                input_model=create_model(
                    f"{tool('respond')}_input",
                    handle=handle_field,
                    responses=(
                        dict[str, dict[str, Any]],
                        Field(description='Answers by question key, e.g. {"q1": {"approve": true}}.'),
                    ),
                ),
                output_model=RespondOutput,
                handler=_guarded(handlers["respond"]),
                read_only=False,
            )
        )
    return defs


def _reason(job: JobRecord | JobState) -> str | None:
    """Why a failed (or cancelled) job ended, as its error says (`error.data.reason`)."""
    return None if job.error is None else job.error.get("data", {}).get("reason")


def _seconds(arguments: dict[str, Any]) -> float:
    value = arguments.get("wait_seconds") or 0
    return float(value)


def _fetchable(job: JobRecord) -> bool:
    """What a fetch waits for: the job's end, or a question for the caller. A job asked to cancel while a
    worker still holds it (handing back its lease after asking, say) is on its way to `cancelled`, and its
    question is no longer the caller's to answer: that is not it yet."""
    status = Status(job.status)
    if status is Status.WORKING:
        return False
    return status.is_terminal or job.cancel_requested_at is None or job.lease_owner is None


def _progress(job: JobRecord | JobState) -> ProgressView:
    fraction = None
    if job.progress_done is not None and job.progress_total:
        fraction = max(0.0, min(1.0, job.progress_done / job.progress_total))
    return ProgressView(done=job.progress_done, total=job.progress_total, fraction=fraction)
