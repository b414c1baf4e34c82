"""`Follower`, the loop behind `follow`: connect, create or resume the job, watch it through one face,
answer its questions, and settle its outcome in the journal, across lost connections."""

from __future__ import annotations

import functools
import inspect
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import InitVar, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeGuard, TypeVar

import anyio
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, Result
from mcp_types import CreateTaskResult as OlderCreated

from handles.backoff import backoff_seconds
from handles.client.faces import Face, HandleFace, OlderTaskFace, TaskFace, View, caller_error, completed
from handles.client.journal import Journal, JournalEntry, arguments_digest, check_same_work
from handles.client.manifest import (
    Connect,
    Manifest,
    Requirements,
    RequirementsNotMet,
    read_manifest,
    server_identity,
)
from handles.client.outcomes import (
    AuthenticationRefusedError,
    ConnectionLostError,
    DeadlineExceeded,
    FollowError,
    InputCallback,
    InputRequiredError,
    JobCancelledError,
    JobFailedError,
    JobLostError,
    JobToolError,
    OutcomeUnknownError,
    Progress,
    ProgressCallback,
    Question,
    Retryable,
    StartRefusedError,
    UnsupportedServerError,
)
from handles.client.tasks import (
    DEFAULT_POLL_SECONDS,
    TERMINAL_STATUSES,
    CreateTaskResult,
    TasksClientExtension,
    pushed_status,
    send_unchecked,
)
from handles.client.transient import (
    CANCEL_TIMEOUT_SECONDS,
    AuthenticationError,
    authentication_error,
    is_connection_failure,
    is_transient,
    leaves,
)
from handles.tool_layout import ToolNames

logger = logging.getLogger("handles.client")

Prefer = Literal["auto", "tasks", "handles"]
T = TypeVar("T")
Way = Literal["tasks", "handles", "older"]
"""The face a job is followed through: the Tasks extension, the handle tools, or the 2025-11-25 design."""

MIN_POLL_SECONDS = 0.05


@dataclass(eq=False, kw_only=True)
class Follower:
    """One call of `follow`: what it was asked (named as `follow`'s parameters), and what it has learnt of the
    job so far."""

    client: InitVar[Client | Connect]
    """A connected client, or a factory of them (then `follow` owns its connections)."""
    job: str
    arguments: dict[str, Any]
    key: str
    journal: Journal
    on_progress: ProgressCallback | None
    on_input: InputCallback | None
    deadline: float | timedelta | datetime | None
    cancel_on_abandon: bool
    prefer: Prefer
    server_id: str | None
    long_poll_seconds: float
    request_timeout: float
    retries: int
    jitter: float
    connected: Client | None = field(init=False)
    connect: Connect | None = field(init=False)
    server: str | None = field(init=False, default=None)
    digest: str = field(init=False)
    handle: str | None = field(init=False, default=None)
    status: str | None = field(init=False, default=None)
    interval: float = field(init=False, default=DEFAULT_POLL_SECONDS)
    _last_report: Progress | None = field(init=False, default=None)
    face: Face | None = field(init=False, default=None)
    names: ToolNames = field(init=False, default_factory=ToolNames)
    """The server's tool layout for this job, read from tools/list."""
    deadline_at: float | None = field(init=False, default=None)
    _failures: int = field(init=False, default=0)
    _answers: dict[str, dict[str, Any] | None] = field(init=False, default_factory=dict)

    def __post_init__(self, client: Client | Connect) -> None:
        self.connected = client if isinstance(client, Client) else None
        self.connect = None if isinstance(client, Client) else client
        self.long_poll_seconds = max(0.0, self.long_poll_seconds)
        self.retries = max(0, self.retries)
        self.jitter = max(0.0, self.jitter)
        # connect(url) names its server by the URL, as a client of that URL would be named.
        self.server_id = self.server_id or getattr(self.connect, "server_id", None)
        self.digest = arguments_digest(self.job, self.arguments)

    async def run(self) -> dict[str, Any]:
        if (seconds := _seconds_until(self.deadline)) is not None:
            self.deadline_at = anyio.current_time() + seconds
        scope = anyio.CancelScope(deadline=self.deadline_at if self.deadline_at is not None else float("inf"))
        with scope:
            try:
                return await self._connected()
            except BaseException as exc:
                cancelled = await self._maybe_abandon(exc)
                if scope.cancel_called and not isinstance(exc, FollowError):
                    raise self._deadline(cancelled) from None
                raise
        raise self._deadline(False)  # the deadline passed before anything could be sent

    async def _connected(self) -> dict[str, Any]:
        """`_drive` on the given client, or on clients of our own, re-opened after a lost connection."""
        if self.connect is None:
            return await self._drive()
        while True:
            try:
                async with self.connect() as client:
                    self.connected = client
                    return await self._drive()
            except Exception as exc:
                follow_error = next((leaf for leaf in leaves(exc) if isinstance(leaf, FollowError)), None)
                if follow_error is exc:
                    raise
                if follow_error is not None:
                    raise follow_error from None  # out of the client's exception group
                self._raise_if_refused(exc)
                # Reconnect after a transient error, a transport's crash, or the server's word that a request
                # may be re-sent.
                if not (
                    is_connection_failure(exc) or any(isinstance(leaf, Retryable) for leaf in leaves(exc))
                ):
                    raise
                await self._failed(exc)
            finally:
                self.connected = None

    def _deadline(self, cancelled: bool) -> DeadlineExceeded:
        where = f" (status {self.status})" if self.status else ""
        then = (
            "Cancellation was requested."
            if cancelled
            else "The job goes on; follow the same key again to resume it."
            if self.handle
            else "Its start may not have been sent; follow the same key again (it reuses the idempotency key)."
        )
        return DeadlineExceeded(
            f"The deadline passed before {self.job} ended{where}. {then}",
            key=self.key,
            handle=self.handle,
            status=self.status,
            cancelled=cancelled,
        )

    async def _drive(self) -> dict[str, Any]:
        client = self._client
        if self.server is None:
            self.server = self.server_id or server_identity(client)
        known = self.journal.get(self.key)
        if known is not None:
            check_same_work(known, server=self.server, job=self.job, arguments_digest=self.digest)
            if known.outcome is not None:
                return self._settle(known.outcome)  # ended earlier: nothing to ask the server
        manifest = await self._with_retries(functools.partial(read_manifest, server=self.server))
        way, via = self._choose(manifest)
        entry, inserted = self.journal.reserve(
            self.key,
            server=self.server,
            job=self.job,
            arguments_digest=self.digest,
            created_via=via,
            state="starting" if via == "start" else "creating",
        )
        if entry.outcome is not None:
            return self._settle(entry.outcome)
        self.handle = entry.handle
        first_poll: float | None = None
        if self.handle is None:
            if entry.created_via == "call":
                if not inserted:
                    # An earlier run sent the create and never learnt its outcome; it has no idempotency key.
                    raise self._unknown()
                outcome = await self._create_task(older=way == "older")
                if outcome is not None:
                    return outcome
            else:
                first_poll = await self._start(entry)
        assert self.handle is not None
        key, handle, timeout = self.key, self.handle, self.request_timeout
        if way != "tasks":
            self.face = (
                HandleFace(key, handle, timeout, self.job, self.names)
                if way == "handles"
                else OlderTaskFace(key, handle, timeout, self.long_poll_seconds, self.ask)
            )
            return await self._watch(first_poll)
        self.face = face = TaskFace(key, handle, timeout)
        # Pushed states land in the client's `TasksClientExtension`, if it has one (else the task is polled).
        extension = next((e for e in client.extensions or () if isinstance(e, TasksClientExtension)), None)
        pushes = None if extension is None else extension.pushes
        async with pushed_status(client.session, pushes, self.handle) as face.status:
            return await self._watch(first_poll)

    @property
    def _client(self) -> Client:
        if self.connected is None:
            raise RuntimeError("no connected client")
        return self.connected

    def _unknown(self) -> OutcomeUnknownError:
        self.journal.set_state(self.key, "unknown")
        return OutcomeUnknownError(
            f"A task create for {self.job} was sent without an idempotency key and its answer never arrived: "
            "a job may or may not have started. It is not sent again automatically. Check the server, then "
            f"Journal.forget({self.key!r}) to allow a new start.",
            key=self.key,
        )

    def _choose(self, manifest: Manifest) -> tuple[Way, Literal["start", "call"]]:
        """The face to follow the job through, and how to create it: `<job>_start` when listed, else a
        task-creating `tools/call <job>` (the 2025-11-25 design only where no other face serves)."""
        needs = Requirements(
            modes=("tasks", "handles") if self.prefer == "auto" else self.prefer, jobs=[self.job]
        )
        job = manifest.job(self.job)
        if (
            job is not None
            and self.job in manifest.older_task_tools
            and "tasks" not in job.modes
            and (self.prefer == "tasks" or (self.prefer == "auto" and "handles" not in job.modes))
        ):
            return "older", "call"
        try:
            mode = manifest.check(needs)[self.job]
        except RequirementsNotMet as error:
            raise UnsupportedServerError(error.message, key=self.key) from None
        assert job is not None
        self.names = ToolNames(job.layout or "per_job")
        return ("tasks" if mode == "tasks" else "handles"), "start" if "start" in job.tools else "call"

    async def _start(self, entry: JournalEntry) -> float:
        """`<job>_start` with the journal's idempotency key; re-sent with the same key after a lost answer."""
        arguments = {**self.arguments, "idempotency_key": entry.idempotency_key}

        async def start(client: Client) -> dict[str, Any]:
            result = await client.call_tool(
                f"{self.job}_start", arguments, read_timeout_seconds=self.request_timeout
            )
            if result.is_error:
                body = caller_error(result)
                if body.get("retryable") and body.get("error") not in _REFUSALS_TO_REPORT:
                    raise Retryable(str(body.get("message")))
                self.journal.forget(self.key)  # nothing was started: the key is free again
                raise StartRefusedError(body, key=self.key)
            return result.structured_content or {}

        data = await self._with_retries(start)
        self._started(str(data["handle"]), str(data.get("status")), data.get("poll_after_ms"))
        if not data.get("created", True):
            logger.info("%s: the server returned the job already started with this idempotency key", self.key)
        await self._report(View(status=str(self.status), message=data.get("status_message")))
        return anyio.current_time()

    def _started(self, handle: str, status: str, poll_ms: Any) -> None:
        """Record the job's handle and status in the journal, and the server's polling hint (if a number)."""
        self.handle, self.status = handle, status
        self.journal.set_handle(self.key, handle, status)
        if isinstance(poll_ms, int | float):
            self.interval = max(MIN_POLL_SECONDS, poll_ms / 1000)

    async def _create_task(self, older: bool) -> dict[str, Any] | None:
        """`tools/call <job>` declaring the extension, or asking for a task of the 2025-11-25 design (`older`):
        sent once; an unknown outcome is reported, never retried."""
        session = self._client.session
        created: Result
        try:
            if older:
                # Unchecked: the SDK takes any tools/call answer at 2025-11-25 for a CallToolResult.
                params = {"name": self.job, "arguments": self.arguments, "task": {}}
                raw = await send_unchecked(session, "tools/call", params, timeout=self.request_timeout)
                created = (OlderCreated if "task" in raw else CallToolResult).model_validate(raw)
            else:
                created = await session.call_tool(
                    self.job, self.arguments, read_timeout_seconds=self.request_timeout, allow_claimed=True
                )
        except Exception as exc:
            if is_transient(exc):
                raise self._unknown() from exc
            self.journal.forget(self.key)
            self._raise_if_refused(exc)
            if isinstance(exc, MCPError):
                raise StartRefusedError(exc.error.model_dump(mode="json"), key=self.key) from exc
            raise
        if isinstance(created, CreateTaskResult | OlderCreated):
            task = created.task if isinstance(created, OlderCreated) else created
            poll = task.poll_interval_ms if isinstance(task, CreateTaskResult) else task.poll_interval
            self._started(task.task_id, task.status, poll)
            return None
        if isinstance(created, CallToolResult):
            # The server answered at once instead of creating a task.
            if created.is_error and {"error", "next"} <= (refusal := caller_error(created)).keys():
                # It refused to start the job (a paused job kind, a limit, bad arguments): no job exists.
                self.journal.forget(self.key)
                raise StartRefusedError(refusal, key=self.key)
            handoff = created.structured_content
            if not created.is_error and _is_handoff(handoff, self.job):
                # No task (the Tasks kill switch is on), but the job runs: follow it by its handle.
                self._started(handoff["handle"], handoff["status"], handoff["poll_after_ms"])
                return None
            raw = created.model_dump(by_alias=True, mode="json", exclude_none=True)
            return self._settle(self._finish(completed(raw)))
        self.journal.forget(self.key)
        raise UnsupportedServerError(
            f"Unexpected answer to tools/call {self.job}: {type(created).__name__}", key=self.key
        )

    async def _watch(self, first_poll: float | None) -> dict[str, Any]:
        face = self.face
        assert face is not None
        last_poll = first_poll
        answered: set[str] = set()
        while True:
            if last_poll is not None and not face.pushed:
                # Never sooner than the server's hint; the jitter only ever adds to it.
                spacing = self.interval * (1 + self.jitter * random.random())
                await anyio.sleep(max(0.0, last_poll + spacing - anyio.current_time()))
            last_poll = anyio.current_time()
            # How long the observation may wait for news: the handle tools' long-poll, or a pushed task state.
            wait = self.long_poll_seconds if isinstance(face, HandleFace) else self.interval
            if self.deadline_at is not None:
                wait = max(0.0, min(wait, self.deadline_at - anyio.current_time()))
            view = await self._with_retries(functools.partial(face.observe, wait=wait))
            if view.poll_ms is not None:
                self.interval = max(MIN_POLL_SECONDS, view.poll_ms / 1000)
            if view.status != self.status:
                self.status = view.status
                if not view.ended:
                    self.journal.set_state(self.key, view.status)
            await self._report(view)
            if view.ended:
                outcome = await self._with_retries(functools.partial(face.outcome, view=view))
                return self._settle(self._finish(outcome))
            if view.status == "input_required":
                fresh = {k: q for k, q in view.questions.items() if k not in answered}
                if fresh:
                    await self._answer(face, fresh)
                    answered.update(fresh)

    async def ask(self, question: Question, *others: Question) -> dict[str, Any] | None:
        """The caller's answer to `question` (None declines), asked once per question even across
        reconnections; without a callback, `InputRequiredError` with it and `others`."""
        if question.key not in self._answers:
            if self.on_input is None:
                raise InputRequiredError([question, *others], key=self.key, handle=self.handle or "")
            answer = self.on_input(question.key, question.message, question.requested_schema)
            if inspect.isawaitable(answer):
                answer = await answer
            self._answers[question.key] = None if answer is None else dict(answer)
        return self._answers[question.key]

    async def _answer(self, face: Face, fresh: dict[str, Question]) -> None:
        """Ask the callback for each question, then send the answers back."""
        for question in fresh.values():
            await self.ask(question, *(other for other in fresh.values() if other is not question))
        declined = [key for key in fresh if self._answers[key] is None]
        if declined:
            await self._with_retries(functools.partial(face.decline, keys=declined))
            return
        answers = {key: answer for key in fresh if (answer := self._answers[key]) is not None}
        await self._with_retries(functools.partial(face.answer, answers=answers))

    async def _report(self, view: View) -> None:
        if self.on_progress is None or self.handle is None:
            return
        update = Progress(
            key=self.key,
            job=self.job,
            handle=self.handle,
            status=view.status,
            message=view.message,
            done=view.done,
            total=view.total,
        )
        if update == self._last_report:
            return
        self._last_report = update
        outcome = self.on_progress(update)
        if inspect.isawaitable(outcome):
            await outcome

    def _finish(self, outcome: dict[str, Any]) -> dict[str, Any]:
        self.status = str(outcome["status"])
        self.journal.finish(self.key, self.status, outcome)
        return outcome

    def _settle(self, outcome: dict[str, Any]) -> dict[str, Any]:
        """The recorded outcome as a return value or the matching error."""
        status = outcome.get("status")
        handle = self.handle or getattr(self.journal.get(self.key), "handle", None)
        if status == "completed":
            if "tool_error" in outcome:
                raise JobToolError(str(outcome["tool_error"]), key=self.key, handle=handle)
            result = outcome.get("result")
            return result if isinstance(result, dict) else {"result": result}
        if status == "failed":
            raise JobFailedError(dict(outcome.get("error") or {}), key=self.key, handle=handle)
        raise JobCancelledError(
            str(outcome.get("message") or f"The {self.job} job was cancelled."), key=self.key, handle=handle
        )

    async def _maybe_abandon(self, exc: BaseException) -> bool:
        """Cancel the job when asked to and we stop following it early; True when a cancel was sent."""
        if not self.cancel_on_abandon or self.handle is None or self.face is None:
            return False
        if self.status in TERMINAL_STATUSES or isinstance(
            exc,
            JobLostError
            | ConnectionLostError
            | AuthenticationError
            | JobFailedError
            | JobToolError
            | JobCancelledError,
        ):
            return False
        face = self.face
        with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_TIMEOUT_SECONDS):
            try:
                if self.connect is None:
                    await face.cancel(self._client)
                else:
                    async with self.connect() as client:
                        await face.cancel(client)
                logger.info("%s: cancelled the abandoned %s job", self.key, self.job)
                self.journal.set_state(self.key, "cancel_requested")
                return True
            except Exception:
                logger.warning("%s: could not cancel the abandoned %s job", self.key, self.job, exc_info=True)
        return False

    async def _with_retries(self, operation: Callable[[Client], Awaitable[T]]) -> T:
        """Run `operation`; after a transient failure, back off and retry it (with a factory: on a new client)."""
        while True:
            try:
                result = await operation(self._client)
            except Exception as exc:
                self._raise_if_refused(exc)
                if self.connect is not None or not (isinstance(exc, Retryable) or is_transient(exc)):
                    raise
                await self._failed(exc)
                continue
            self._failures = 0
            return result

    def _raise_if_refused(self, exc: BaseException) -> None:
        """A 401/403 answer is no transient failure: raise it at once, as `AuthenticationRefusedError`."""
        refused = authentication_error(exc)
        if refused is not None:
            raise AuthenticationRefusedError(refused, key=self.key, handle=self.handle) from None

    async def _failed(self, exc: BaseException) -> None:
        """Count one more failure in a row: raise `ConnectionLostError` past `retries`, else back off."""
        self._failures += 1
        if self._failures > self.retries:
            raise ConnectionLostError(
                f"Could not reach the server after {self._failures} attempts ({_describe(exc)}). The job is "
                "kept in the journal: follow the same key again to resume it.",
                key=self.key,
                handle=self.handle,
            ) from exc
        pause = backoff_seconds(self._failures, self.jitter)
        logger.info("%s: %s; retrying in %.1f s", self.key, _describe(exc), pause)
        await anyio.sleep(pause)


_REFUSALS_TO_REPORT = frozenset({"limit_reached", "paused"})
"""Retryable refusals of a start that last longer than a reconnect: raised as `StartRefusedError` (whose
`error` carries `retry_after_seconds` for a pause) for the caller to schedule, not retried here."""


def _is_handoff(body: dict[str, Any] | None, job: str) -> TypeGuard[dict[str, Any]]:
    """Whether a plain `<job>` call's answer is the job's handle (it outlived the inline budget, asks a
    question, or got no task while the server's Tasks kill switch is on) rather than its result."""
    return (
        isinstance(body, dict)
        and body.get("job") == job
        and isinstance(body.get("handle"), str)
        and body.get("status") in ("working", "input_required")
        and isinstance(body.get("poll_after_ms"), int | float)
        and isinstance(body.get("next"), str)
    )


def _seconds_until(deadline: float | timedelta | datetime | None) -> float | None:
    if deadline is None:
        return None
    if isinstance(deadline, datetime):
        if deadline.tzinfo is None:
            raise ValueError("deadline must be an aware datetime (with a timezone)")
        return (deadline - datetime.now(UTC)).total_seconds()
    if isinstance(deadline, timedelta):
        return deadline.total_seconds()
    return float(deadline)


def _describe(exc: BaseException) -> str:
    inner = leaves(exc)
    if len(inner) == 1 and inner[0] is not exc:
        exc = inner[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
