"""`follow`: one call follows one job to its end, resuming from the journal after any interruption; and
`Follower`, the loop behind it, with the faces it follows through (handle tools, Tasks, 2025-11-25)."""

from __future__ import annotations

import functools
import inspect
import json
import logging
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import InitVar, dataclass, field
from datetime import UTC, datetime, timedelta
from os import PathLike
from typing import Any, Literal, TypeVar

import anyio
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    CallToolResult,
    CancelTaskRequest,
    CancelTaskRequestParams,
    CancelTaskResult,
    ElicitRequestParams,
    ElicitResult,
    ErrorData,
    GetTaskPayloadRequest,
    GetTaskPayloadRequestParams,
    GetTaskRequest,
    GetTaskRequestParams,
    GetTaskResult,
    Result,
)
from mcp_types import CreateTaskResult as OlderCreated

from handles.backoff import backoff_seconds
from handles.client.http import http_client
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
    AnswerRejectedError,
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
    DetailedTask,
    PushedStatus,
    TaskPushes,
    TasksClientExtension,
    cancel_task,
    get_task,
    pushed_status,
    send_unchecked,
    update_task,
)
from handles.client.transient import (
    AUTHENTICATION_FAILED,
    CANCEL_TIMEOUT_SECONDS,
    TRANSIENT_MCP_CODES,
    AuthenticationError,
    authentication_error,
    is_connection_failure,
    is_transient,
    leaves,
)
from handles.results import link_of, text_of, tool_error_text
from handles.tasks_wire import TASKS_EXTENSION
from handles.tool_layout import ToolNames

logger = logging.getLogger("handles.client")

Prefer = Literal["auto", "tasks", "handles"]
T = TypeVar("T")
Way = Literal["tasks", "handles", "older"]
"""The face a job is followed through: the Tasks extension, the handle tools, or the 2025-11-25 design."""

MIN_POLL_SECONDS = 0.05


def connect(
    server: Any, *, token: str | None = None, headers: dict[str, str] | None = None, **options: Any
) -> Connect:
    """A factory of `mcp.Client(server, **options)` that declare the Tasks extension; a URL's clients send
    `token` as a bearer token and keep 401/403 recognisable."""
    extensions = list(options.pop("extensions", None) or ())
    if not any(getattr(e, "identifier", None) == TASKS_EXTENSION for e in extensions):
        extensions.append(TasksClientExtension())
    if not (isinstance(server, str) and server.startswith(("http://", "https://"))):
        if token is not None or headers is not None:
            raise ValueError("token= and headers= apply to a server given by its http(s) URL")
        return functools.partial(Client, server, extensions=extensions, **options)

    @asynccontextmanager
    async def open_client() -> AsyncIterator[Client]:
        async with (
            http_client(token=token, headers=headers) as http,
            Client(
                streamable_http_client(server, http_client=http), extensions=extensions, **options
            ) as client,
        ):
            yield client

    open_client.server_id = server.split("?", 1)[0]  # type: ignore[attr-defined]
    return open_client


async def follow(
    client: Client | Connect,
    job: str,
    arguments: dict[str, Any] | None = None,
    *,
    key: str | None = None,
    journal: Journal | str | PathLike[str] | None = None,
    on_progress: ProgressCallback | None = None,
    on_input: InputCallback | None = None,
    deadline: float | timedelta | datetime | None = None,
    cancel_on_abandon: bool = False,
    prefer: Prefer = "auto",
    server_id: str | None = None,
    long_poll_seconds: float = 15.0,
    request_timeout: float = 30.0,
    retries: int = 3,
    jitter: float = 0.2,
) -> dict[str, Any]:
    """Start `job` (or resume the one `key` names) and follow it to its end; returns its structured result.

    - `client`: a connected `mcp.Client`, or a factory of them; only with a factory can `follow` open a
      new connection when one is lost (at most `retries` failures in a row).
    - `key`: the caller's stable name for this unit of work; with a `journal` a later call resumes it.
    - `deadline`: seconds (or a `timedelta`) from now, or an aware `datetime`; absolute for this call.
    - `on_input(key, message, requested_schema)` answers the job's questions; None declines (cancels).
    - `cancel_on_abandon`: cancel the job when this call stops following it before it ends.
    - `prefer`: "auto" (Tasks when both sides support it, else the handle tools), "tasks" or "handles".
    - `server_id`: the server's stable name in the journal (default: its URL or command line).

    Raises a `FollowError` subclass for every ending other than a result.
    """
    if prefer not in ("auto", "tasks", "handles"):
        raise ValueError("prefer must be 'auto', 'tasks' or 'handles'")
    book = journal if isinstance(journal, Journal) else Journal(journal or ":memory:")
    follower = Follower(
        connection=client,
        job=job,
        arguments=dict(arguments or {}),
        key=key or f"{job}-{uuid.uuid4().hex}",
        journal=book,
        on_progress=on_progress,
        on_input=on_input,
        seconds=_seconds_until(deadline),
        cancel_on_abandon=cancel_on_abandon,
        prefer=prefer,
        server_id=server_id,
        long_poll=max(0.0, long_poll_seconds),
        request_timeout=request_timeout,
        retries=max(0, retries),
        jitter=max(0.0, jitter),
    )
    return await follower.run()


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


_LOST_CODES = frozenset({"unknown_handle", "expired_handle", "wrong_job"})
_RAISED_AS_IS = TRANSIENT_MCP_CODES | {AUTHENTICATION_FAILED}  # retried, or an authentication error


@dataclass
class View:
    """One observation of the job, whichever face it came from."""

    status: str
    message: str | None = None
    done: float | None = None
    total: float | None = None
    questions: dict[str, Question] = field(default_factory=dict)
    poll_ms: float | None = None
    task: DetailedTask | None = None

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL_STATUSES


def caller_error(result: CallToolResult) -> dict[str, Any]:
    """The JSON body of a handle tool's caller error (or its text as the message)."""
    text = text_of(result)
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        body = None
    return body if isinstance(body, dict) else {"error": "tool_error", "message": text or "The call failed."}


class HandleFace:
    """The handle tools: `<job>_progress` (long-poll), `<job>_respond`, `<job>_cancel`, `<job>_fetch`,
    or the shared `jobs_*` ones of a compact server (the follower read the layout from tools/list)."""

    pushed = False  # the handle tools long-poll instead

    def __init__(self, follower: Follower, handle: str) -> None:
        self.f = follower
        self.handle = handle

    async def _call(
        self,
        client: Client,
        verb: str,
        arguments: dict[str, Any],
        wait: float = 0.0,
        refused: type[FollowError] = FollowError,
    ) -> CallToolResult:
        """Call `<job>_<verb>` on the handle; a caller error becomes `JobLostError`, a retry, or `refused`."""
        names = self.f.names or ToolNames()
        result = await client.call_tool(
            names.name(self.f.job, verb),
            {"handle": self.handle, **arguments},
            read_timeout_seconds=wait + self.f.request_timeout,
        )
        if result.is_error and result.structured_content is None:
            body = caller_error(result)
            if body.get("error") in _LOST_CODES:
                raise JobLostError(str(body.get("message")), key=self.f.key, handle=self.handle)
            if body.get("retryable"):
                raise Retryable(str(body.get("message")))
            raise refused(str(body.get("message")), key=self.f.key, handle=self.handle)
        return result

    async def observe(self, client: Client, wait: float) -> View:
        result = await self._call(client, "progress", {"wait_seconds": round(wait, 3)}, wait)
        data = result.structured_content or {}
        progress = data.get("progress") or {}
        questions = {
            key: Question(key, str(request.get("message", "")), dict(request.get("requested_schema") or {}))
            for key, request in (data.get("input_requests") or {}).items()
        }
        return View(
            status=str(data.get("status")),
            message=data.get("status_message"),
            done=progress.get("done"),
            total=progress.get("total"),
            questions=questions,
            poll_ms=data.get("poll_after_ms"),
        )

    async def answer(self, client: Client, answers: dict[str, dict[str, Any]]) -> None:
        await self._call(client, "respond", {"responses": answers}, refused=AnswerRejectedError)

    async def decline(self, client: Client, keys: list[str]) -> None:
        # The handle tools have no "declined" answer: a job cannot go on without it, so it is cancelled.
        await self.cancel(client)

    async def cancel(self, client: Client) -> None:
        await self._call(client, "cancel", {})

    async def outcome(self, client: Client, view: View) -> dict[str, Any]:
        result = await self._call(client, "fetch", {"wait_seconds": 0})
        data = result.structured_content or {}
        status = str(data.get("status"))
        if status == "completed":
            if data.get("tool_error") is not None:
                return {"status": status, "tool_error": data["tool_error"]}
            # A result too large to travel inline is its link (read it with `read_link`).
            return {"status": status, "result": data.get("result") or data.get("result_link")}
        if status == "failed":
            return {
                "status": status,
                "error": data.get("error") or {"code": INTERNAL_ERROR, "message": "failed"},
            }
        return {"status": status, "message": data.get("status_message")}


class TaskFace:
    """The Tasks extension: `tasks/get`, `tasks/update`, `tasks/cancel` on the handle as `taskId`, and the
    task's `notifications/tasks` while `status` says the server pushes them."""

    def __init__(self, follower: Follower, handle: str) -> None:
        self.f = follower
        self.handle = handle
        self.status: PushedStatus | None = None

    @property
    def pushed(self) -> bool:
        return self.status is not None and self.status.pushed

    def _lost(self, error: MCPError) -> Exception:
        """What a failed task request raises: the error itself when it is retried or refused, else the job lost."""
        if error.error.code in _RAISED_AS_IS:
            return error
        if error.error.code == INVALID_PARAMS:
            return JobLostError(error.error.message, key=self.f.key, handle=self.handle)
        return FollowError(error.error.message, key=self.f.key, handle=self.handle)

    async def observe(self, client: Client, wait: float) -> View:
        task = None if self.status is None else await self.status.wait_push(self.f.interval)
        if task is None:
            try:
                task = await get_task(client.session, self.handle, timeout=self.f.request_timeout)
            except MCPError as error:
                raise self._lost(error) from None
        # A handles server only asks form elicitations (`elicitation/create`, message + requestedSchema).
        questions = {
            key: Question(
                key,
                str((request.get("params") or {}).get("message", "")),
                dict((request.get("params") or {}).get("requestedSchema") or {}),
            )
            for key, request in (task.input_requests or {}).items()
        }
        return View(
            status=task.status,
            message=task.status_message,
            done=task.done,
            total=task.total,
            questions=questions,
            poll_ms=task.poll_interval_ms,
            task=task,
        )

    async def _update(self, client: Client, responses: dict[str, Any]) -> None:
        try:
            await update_task(client.session, self.handle, responses, timeout=self.f.request_timeout)
        except MCPError as error:
            if error.error.code == INVALID_PARAMS:
                await self.observe(client, 0.0)  # the same code for a vanished task: this raises JobLostError
                raise AnswerRejectedError(error.error.message, key=self.f.key, handle=self.handle) from None
            raise self._lost(error) from None

    async def answer(self, client: Client, answers: dict[str, dict[str, Any]]) -> None:
        await self._update(client, {k: {"action": "accept", "content": v} for k, v in answers.items()})

    async def decline(self, client: Client, keys: list[str]) -> None:
        await self._update(client, {k: {"action": "decline"} for k in keys})

    async def cancel(self, client: Client) -> None:
        try:
            await cancel_task(client.session, self.handle, timeout=self.f.request_timeout)
        except MCPError as error:
            raise self._lost(error) from None

    async def outcome(self, client: Client, view: View) -> dict[str, Any]:
        task = view.task
        assert task is not None
        if task.status == "completed":
            return completed(task.result or {})
        if task.status == "failed":
            error = task.error or {
                "code": INTERNAL_ERROR,
                "message": task.status_message or "The task failed.",
            }
            return {"status": "failed", "error": error}
        return {"status": "cancelled", "message": task.status_message}


class OlderTaskFace(TaskFace):
    """The experimental Tasks design of MCP 2025-11-25: `tasks/get`, `tasks/cancel`, and `tasks/result`,
    whose stream asks the job's questions, answered through the follower's `ask` while it waits."""

    _ended: CallToolResult | MCPError | None = None  # what tasks/result answered, once the job ended

    async def _send(self, client: Client, request: Any, answer: type[Any]) -> Any:
        try:
            return await client.session.send_request(request, answer, self.f.request_timeout)
        except MCPError as error:
            raise self._lost(error) from None

    async def observe(self, client: Client, wait: float) -> View:
        get = GetTaskRequest(params=GetTaskRequestParams(task_id=self.handle))
        task: GetTaskResult = await self._send(client, get, GetTaskResult)
        if task.status == "input_required":
            self._ended = await self._result(client)  # answers the questions, then waits for the end
            task = await self._send(client, get, GetTaskResult)
        if task.status not in TERMINAL_STATUSES:
            self._ended = None  # the server's wait ran out first
        return View(task.status, task.status_message, poll_ms=task.poll_interval)

    async def _result(self, client: Client) -> CallToolResult | MCPError:
        """`tasks/result`, each question on its stream answered through the follower's `ask` (what it
        raises, such as `InputRequiredError`, ends the request and is raised)."""
        session = client.session
        stopped: list[FollowError] = []

        async def answer(
            context: ClientRequestContext, params: ElicitRequestParams
        ) -> ElicitResult | ErrorData:
            schema = dict(getattr(params, "requested_schema", None) or {})
            try:
                reply = await self.f.ask(Question(str(context.request_id), params.message, schema))
            except FollowError as error:
                stopped.append(error)
                scope.cancel()
                return ErrorData(code=INVALID_PARAMS, message=str(error))
            return (
                ElicitResult(action="decline")
                if reply is None
                else ElicitResult(action="accept", content=reply)
            )

        request = GetTaskPayloadRequest(params=GetTaskPayloadRequestParams(task_id=self.handle))
        previous, session._elicitation_callback = session._elicitation_callback, answer
        try:
            with anyio.CancelScope() as scope:
                result: CallToolResult = await session.send_request(
                    request, CallToolResult, self.f.long_poll + self.f.request_timeout
                )
                return result
        except MCPError as error:
            if error.error.code == AUTHENTICATION_FAILED:
                raise
            return error  # the job's own error, or a lost wait: the next tasks/get tells
        finally:
            session._elicitation_callback = previous
        raise stopped[0]

    async def cancel(self, client: Client) -> None:
        cancel = CancelTaskRequest(params=CancelTaskRequestParams(task_id=self.handle))
        await self._send(client, cancel, CancelTaskResult)

    async def outcome(self, client: Client, view: View) -> dict[str, Any]:
        if view.status == "cancelled":
            return {"status": "cancelled", "message": view.message}
        # A stored error may be a wait that ran out just before the end: only a result is kept.
        ended = self._ended if isinstance(self._ended, CallToolResult) else await self._result(client)
        if isinstance(ended, CallToolResult):
            return completed(ended.model_dump(by_alias=True, mode="json", exclude_none=True))
        if view.status == "failed":
            return {"status": "failed", "error": ended.error.model_dump(mode="json", exclude_none=True)}
        raise self._lost(ended)


def completed(result: dict[str, Any]) -> dict[str, Any]:
    """The outcome of a job that ended `completed` with `result`, a `CallToolResult` dict: its structured
    content, else its link when it is a large result (read it with `read_link`), else the whole result."""
    if result.get("isError"):
        return {"status": "completed", "tool_error": tool_error_text(result)}
    structured = result.get("structuredContent")
    if structured is None and (link := link_of(result)) is not None:
        structured = link.model_dump(mode="json")
    return {"status": "completed", "result": result if structured is None else structured}


Face = HandleFace | TaskFace


@dataclass(eq=False, kw_only=True)
class Follower:
    """One call of `follow`: what it was asked (the fields given), and what it has learnt of the job so far."""

    connection: InitVar[Client | Connect]
    """A connected client, or a factory of them (then `follow` owns its connections)."""
    job: str
    arguments: dict[str, Any]
    key: str
    journal: Journal
    on_progress: ProgressCallback | None
    on_input: InputCallback | None
    seconds: float | None
    cancel_on_abandon: bool
    prefer: Prefer
    server_id: str | None
    long_poll: float
    request_timeout: float
    retries: int
    jitter: float
    client: Client | None = field(init=False)
    connect: Connect | None = field(init=False)
    server: str | None = field(init=False, default=None)
    digest: str = field(init=False)
    handle: str | None = field(init=False, default=None)
    status: str | None = field(init=False, default=None)
    interval: float = field(init=False, default=DEFAULT_POLL_SECONDS)
    _last_report: Progress | None = field(init=False, default=None)
    face: Face | None = field(init=False, default=None)
    names: ToolNames | None = field(init=False, default=None)
    """The server's tool layout for this job, read from tools/list (None: it has no handle tools for it)."""
    deadline_at: float | None = field(init=False, default=None)
    _failures: int = field(init=False, default=0)
    _answers: dict[str, dict[str, Any] | None] = field(init=False, default_factory=dict)

    def __post_init__(self, connection: Client | Connect) -> None:
        self.client = connection if isinstance(connection, Client) else None
        self.connect = None if isinstance(connection, Client) else connection
        # connect(url) names its server by the URL, as a client of that URL would be named.
        self.server_id = self.server_id or getattr(self.connect, "server_id", None)
        self.digest = arguments_digest(self.job, self.arguments)

    async def run(self) -> dict[str, Any]:
        if self.seconds is not None:
            self.deadline_at = anyio.current_time() + self.seconds
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
                    self.client = client
                    return await self._drive()
            except Exception as exc:
                follow_error = _follow_error_in(exc)
                if follow_error is exc:
                    raise
                if follow_error is not None:
                    raise follow_error from None  # out of the client's exception group
                self._raise_if_refused(exc)
                if not _connection_failure(exc):
                    raise
                await self._failed(exc)
            finally:
                self.client = None

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
        if way != "tasks":
            self.face = (HandleFace if way == "handles" else OlderTaskFace)(self, self.handle)
            return await self._watch(first_poll)
        self.face = face = TaskFace(self, self.handle)
        async with pushed_status(client.session, _pushes(client), self.handle) as face.status:
            return await self._watch(first_poll)

    @property
    def _client(self) -> Client:
        if self.client is None:
            raise RuntimeError("no connected client")
        return self.client

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
        self.names = ToolNames(job.layout) if job.layout is not None else None
        return ("tasks" if mode == "tasks" else "handles"), "start" if "start" in job.tools else "call"

    async def _start(self, entry: JournalEntry) -> float:
        """`<job>_start` with the journal's idempotency key; re-sent with the same key after a lost answer."""
        arguments = {**self.arguments, "idempotency_key": entry.idempotency_key}

        async def start(client: Client) -> CallToolResult:
            result = await client.call_tool(
                f"{self.job}_start", arguments, read_timeout_seconds=self.request_timeout
            )
            if result.is_error:
                body = caller_error(result)
                if body.get("retryable") and body.get("error") not in _REFUSALS_TO_REPORT:
                    raise Retryable(str(body.get("message")))
                self.journal.forget(self.key)  # nothing was started: the key is free again
                raise StartRefusedError(body, key=self.key)
            return result

        result = await self._with_retries(start)
        data = result.structured_content or {}
        hint = data.get("poll_after_ms")
        self._started(
            str(data["handle"]), str(data.get("status")), hint if isinstance(hint, int | float) else None
        )
        if not data.get("created", True):
            logger.info("%s: the server returned the job already started with this idempotency key", self.key)
        await self._report(View(status=str(self.status), message=data.get("status_message")))
        return anyio.current_time()

    def _started(self, handle: str, status: str, poll_ms: float | None) -> None:
        """Record the job's handle and status in the journal, and the server's polling hint."""
        self.handle, self.status = handle, status
        self.journal.set_handle(self.key, handle, status)
        if poll_ms is not None:
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
            if _transient(exc):
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
                assert handoff is not None
                self._started(str(handoff["handle"]), str(handoff["status"]), float(handoff["poll_after_ms"]))
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
            wait = self.long_poll if isinstance(face, HandleFace) else 0.0
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
                if self.connect is not None or not _transient(exc):
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


def _pushes(client: Client) -> TaskPushes | None:
    """Where the client's `TasksClientExtension` receives `notifications/tasks` (None: it polls)."""
    for extension in client.extensions or ():
        if isinstance(extension, TasksClientExtension):
            return extension.pushes
    return None


_REFUSALS_TO_REPORT = frozenset({"limit_reached", "paused"})
"""Retryable refusals of a start that last longer than a reconnect: raised as `StartRefusedError` (whose
`error` carries `retry_after_seconds` for a pause) for the caller to schedule, not retried here."""


def _is_handoff(body: dict[str, Any] | None, job: str) -> bool:
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


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, Retryable) or is_transient(exc)


def _follow_error_in(exc: BaseException) -> FollowError | None:
    """A `FollowError` raised inside a client's task group comes out wrapped in an exception group."""
    return next((leaf for leaf in leaves(exc) if isinstance(leaf, FollowError)), None)


def _connection_failure(exc: BaseException) -> bool:
    """A transient error or a transport's crash, or the server's word that the same request may be re-sent."""
    return is_connection_failure(exc) or any(isinstance(leaf, Retryable) for leaf in leaves(exc))


def _describe(exc: BaseException) -> str:
    inner = leaves(exc)
    if len(inner) == 1 and inner[0] is not exc:
        exc = inner[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
