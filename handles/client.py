"""Follow a job of a `handles` server to its end, from the official `mcp` client.

```python
from handles.client import Journal, connect, follow

report = await follow(
    connect("http://127.0.0.1:8000/mcp"),  # or a connected mcp.Client
    "generate_report", {"account": "acme"},
    key="acme-report-2026-07", journal=Journal("jobs.db"), deadline=600,
    on_progress=print, on_input=ask_a_person,
)
```

One call, one job, on either face of the server:

- Creation always goes through `<job>_start` with an `idempotency_key` when the
  server lists it (every `handles` server does). The key is written to the journal
  *before* the start is sent, so a start whose answer was lost (a network error, a
  killed process) is re-sent with the same key and the server returns the same job
  (`created: false`) instead of starting a second one. The Tasks extension's own
  create (`tools/call <job>` declaring the extension) has no idempotency key, so
  it is used only on a server without `<job>_start`, and then at most once: when
  its outcome is unknown the call raises `OutcomeUnknownError` instead of guessing.
- Observation uses the Tasks extension (`tasks/get`, `tasks/update`,
  `tasks/cancel`) when the client declares it and the server advertises it, and
  otherwise the handle tools (`<job>_progress` long-poll, `<job>_respond`,
  `<job>_fetch`, `<job>_cancel`). The `taskId` is the handle, so one job can be
  followed through either face, and a restarted client may pick the other one.
- Polls are spaced by at least the server's hint (`poll_after_ms` /
  `pollIntervalMs`) plus random jitter; the deadline is absolute, so a job that
  keeps reporting progress never extends it.
- The journal (a small SQLite file) maps the caller's `key` to the server, the
  job, the idempotency key, the handle and the final outcome: a restarted client
  calling `follow` with the same key resumes the same job, and once the job has
  ended it gets the recorded outcome without asking the server again
  (`Journal.forget(key)` frees the key for new work).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import logging
import random
import sqlite3
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from os import PathLike
from pathlib import Path
from typing import Any, Literal, TypeVar

import anyio
from mcp import Client, StdioServerParameters
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CONNECTION_CLOSED,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    REQUEST_TIMEOUT,
    CallToolResult,
    TextContent,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from handles.tasks_client import (
    DEFAULT_POLL_SECONDS,
    TASKS_EXTENSION,
    TERMINAL_STATUSES,
    CreateTaskResult,
    DetailedTask,
    TasksClientExtension,
    cancel_task,
    get_task,
    update_task,
)

__all__ = [
    "AnswerRejectedError",
    "Connect",
    "ConnectionLostError",
    "DeadlineExceeded",
    "FollowError",
    "InputCallback",
    "InputRequiredError",
    "JobCancelledError",
    "JobFailedError",
    "JobLostError",
    "JobToolError",
    "Journal",
    "JournalConflict",
    "JournalEntry",
    "OutcomeUnknownError",
    "Progress",
    "ProgressCallback",
    "Question",
    "StartRefusedError",
    "UnsupportedServerError",
    "arguments_digest",
    "connect",
    "follow",
    "server_identity",
]

logger = logging.getLogger("handles.client")

Prefer = Literal["auto", "tasks", "handles"]
T = TypeVar("T")

CANCEL_TIMEOUT_SECONDS = 5.0
MIN_POLL_SECONDS = 0.05
_LOST_CODES = frozenset({"unknown_handle", "expired_handle", "wrong_job"})
_TRANSIENT_MCP_CODES = frozenset({CONNECTION_CLOSED, REQUEST_TIMEOUT, INTERNAL_ERROR})


# -- what callers see ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Question:
    """One question a job is waiting on."""

    key: str
    message: str
    requested_schema: dict[str, Any]


@dataclass(frozen=True)
class Progress:
    """What the job reported, given to `on_progress` whenever it changes.

    `done` and `total` come from the handle face; the Tasks face carries progress in `message` only.
    """

    key: str
    job: str
    handle: str
    status: str
    message: str | None = None
    done: float | None = None
    total: float | None = None


ProgressCallback = Callable[[Progress], Awaitable[None] | None]
"""Called with each change of status, message or progress (sync or async)."""

InputCallback = Callable[[str, str, dict[str, Any]], Awaitable[dict[str, Any] | None] | dict[str, Any] | None]
"""`(question key, message, requested_schema) -> answer object`, or None to decline (the job is then cancelled)."""


class FollowError(Exception):
    """Base of what `follow` raises. `key` is the journal key; `handle` the job's handle (taskId) when known."""

    def __init__(self, message: str, *, key: str, handle: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.key = key
        self.handle = handle


class JobFailedError(FollowError):
    """The job ended `failed`; `error` is its JSON-RPC error object (`code`, `message`, `data`)."""

    def __init__(self, error: dict[str, Any], *, key: str, handle: str | None) -> None:
        super().__init__(str(error.get("message") or "The job failed."), key=key, handle=handle)
        self.error = error


class JobToolError(FollowError):
    """The job completed with a tool error (`isError: true`): the job's own message, for the caller to act on."""


class JobCancelledError(FollowError):
    """The job ended `cancelled` without a result."""


class DeadlineExceeded(FollowError, TimeoutError):
    """The deadline passed first. Unless `cancelled`, the job goes on: follow the same key again later."""

    def __init__(
        self, message: str, *, key: str, handle: str | None, status: str | None, cancelled: bool
    ) -> None:
        super().__init__(message, key=key, handle=handle)
        self.status = status
        self.cancelled = cancelled


class JobLostError(FollowError):
    """The server no longer knows the handle (expired and deleted, or another principal's). Nothing was restarted."""


class ConnectionLostError(FollowError):
    """The server could not be reached after the allowed retries. The journal keeps the job: follow the key later."""


class StartRefusedError(FollowError):
    """The server refused to start the job (invalid arguments, a limit); no job exists. `error` is its answer."""

    def __init__(self, error: dict[str, Any], *, key: str) -> None:
        super().__init__(str(error.get("message") or "The server refused to start the job."), key=key)
        self.error = error


class OutcomeUnknownError(FollowError):
    """A create that cannot be repeated safely (Tasks `tools/call`, no idempotency key) may or may not have run.

    Reconcile (did a job start?), then `Journal.forget(key)` to allow a new start.
    """


class InputRequiredError(FollowError):
    """The job asked a question and no `on_input` was given. `questions` lists them; the job waits."""

    def __init__(self, questions: list[Question], *, key: str, handle: str) -> None:
        keys = ", ".join(q.key for q in questions)
        super().__init__(
            f"The job is waiting for answers to {keys}; pass on_input to answer.", key=key, handle=handle
        )
        self.questions = questions


class AnswerRejectedError(FollowError):
    """The server refused an answer (it does not fit the requested schema)."""


class JournalConflict(FollowError, ValueError):
    """The key is already used in the journal for another server, job or arguments."""


class UnsupportedServerError(FollowError):
    """The server (or this client) offers no way to run or follow this job as asked."""


class _Retryable(Exception):
    """Internal: the server said nothing changed and the same request may be sent again."""


# -- the journal -----------------------------------------------------------------------------------


_SCHEMA = """
create table if not exists handles_client_follows (
    key text primary key,
    server text not null,
    job text not null,
    arguments_digest text not null,
    idempotency_key text not null,
    created_via text not null,
    handle text,
    state text not null,
    outcome text,
    created_at real not null,
    updated_at real not null
)
"""
_COLUMNS = (
    "key, server, job, arguments_digest, idempotency_key, created_via, handle, state, outcome, "
    "created_at, updated_at"
)


@dataclass(frozen=True)
class JournalEntry:
    """One unit of work the client follows.

    `state` is `starting` (idempotency key stored, handle not known yet), `creating` /
    `unknown` (a non-idempotent Tasks create in flight / lost), the job's last seen
    status, or a terminal status with its `outcome`.
    """

    key: str
    server: str
    job: str
    arguments_digest: str
    idempotency_key: str
    created_via: str
    handle: str | None
    state: str
    outcome: dict[str, Any] | None
    created_at: float
    updated_at: float

    @property
    def ended(self) -> bool:
        return self.outcome is not None


class Journal:
    """A small SQLite file mapping each key to its job; every write is committed before `follow` goes on.

    `Journal(":memory:")` keeps nothing across processes (what `follow` uses without a journal).
    """

    def __init__(self, path: str | PathLike[str]) -> None:
        self.path = str(path)
        self._memory: sqlite3.Connection | None = None
        if self.path == ":memory:":
            self._memory = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        else:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        with self._connection() as db:
            db.execute(_SCHEMA)

    @contextlib.contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        if self._memory is not None:
            yield self._memory
            return
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            db.execute("pragma synchronous = full")
            yield db
        finally:
            db.close()

    def get(self, key: str) -> JournalEntry | None:
        with self._connection() as db:
            row = db.execute(
                f"select {_COLUMNS} from handles_client_follows where key = ?", (key,)
            ).fetchone()
        return None if row is None else _entry(row)

    def entries(self) -> list[JournalEntry]:
        with self._connection() as db:
            rows = db.execute(f"select {_COLUMNS} from handles_client_follows order by created_at").fetchall()
        return [_entry(row) for row in rows]

    def forget(self, key: str) -> None:
        """Drop the key (the server's job, if any, is left alone)."""
        with self._connection() as db:
            db.execute("delete from handles_client_follows where key = ?", (key,))

    def reserve(
        self, key: str, *, server: str, job: str, arguments_digest: str, created_via: str, state: str
    ) -> tuple[JournalEntry, bool]:
        """The entry for `key` and whether this call created it (with a fresh idempotency key).

        Committed before it returns, so the idempotency key is durable before any start is sent.
        Raises `JournalConflict` when the key already names another server, job or arguments.
        """
        now = time.time()
        with self._connection() as db:
            db.execute("begin immediate")
            try:
                inserted = (
                    db.execute(
                        f"insert or ignore into handles_client_follows ({_COLUMNS}) "
                        "values (?, ?, ?, ?, ?, ?, null, ?, null, ?, ?)",
                        (key, server, job, arguments_digest, uuid.uuid4().hex, created_via, state, now, now),
                    ).rowcount
                    == 1
                )
                row = db.execute(
                    f"select {_COLUMNS} from handles_client_follows where key = ?", (key,)
                ).fetchone()
                db.execute("commit")
            except BaseException:
                db.execute("rollback")
                raise
        entry = _entry(row)
        check_same_work(entry, server=server, job=job, arguments_digest=arguments_digest)
        return entry, inserted

    def set_handle(self, key: str, handle: str, state: str) -> None:
        self._update(key, "handle = ?, state = ?", (handle, state))

    def set_state(self, key: str, state: str) -> None:
        self._update(key, "state = ?", (state,))

    def finish(self, key: str, state: str, outcome: dict[str, Any]) -> None:
        self._update(key, "state = ?, outcome = ?", (state, json.dumps(outcome, default=str)))

    def _update(self, key: str, assignments: str, values: tuple[Any, ...]) -> None:
        with self._connection() as db:
            db.execute(
                f"update handles_client_follows set {assignments}, updated_at = ? where key = ?",
                (*values, time.time(), key),
            )


def check_same_work(entry: JournalEntry, *, server: str, job: str, arguments_digest: str) -> None:
    """Raise `JournalConflict` unless `entry` names this server, job and arguments."""
    differences = [
        name
        for name, mine, theirs in (
            ("server", server, entry.server),
            ("job", job, entry.job),
            ("arguments", arguments_digest, entry.arguments_digest),
        )
        if mine != theirs
    ]
    if differences:
        raise JournalConflict(
            f"The key {entry.key!r} already names other work in the journal (different {', '.join(differences)}: "
            f"{entry.job} on {entry.server}). Use another key, or forget this one once it is no longer needed.",
            key=entry.key,
            handle=entry.handle,
        )


def _entry(row: tuple[Any, ...]) -> JournalEntry:
    values = list(row)
    values[8] = None if values[8] is None else json.loads(values[8])
    return JournalEntry(*values)


def arguments_digest(job: str, arguments: dict[str, Any]) -> str:
    canonical = json.dumps([job, arguments], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def server_identity(client: Client) -> str:
    """A stable name for the server behind `client`: its URL, its command line, or its announced name."""
    target = client.server
    if isinstance(target, str):
        return target.split("?", 1)[0]
    if isinstance(target, StdioServerParameters):
        return "stdio:" + " ".join([target.command, *target.args])
    if isinstance(target, MCPServer):
        return f"inprocess:{target.name}"
    info = client.server_info
    return f"server:{info.name if info is not None else type(target).__name__}"


# -- following ---------------------------------------------------------------------------------------


Connect = Callable[[], AbstractAsyncContextManager[Client]]
"""A factory of connected clients: `follow` opens (and re-opens after a lost connection) its own."""


def connect(server: Any, **options: Any) -> Connect:
    """A factory of `mcp.Client(server, **options)` that also declare the Tasks extension.

    `server` is anything `mcp.Client` takes that can be connected more than once: a URL, a
    `StdioServerParameters` or an in-process server (for bearer tokens, write a factory that builds
    `streamable_http_client(url, http_client=...)` afresh each time, as `example_server.client_demo` does).
    """
    extensions = list(options.pop("extensions", None) or ())
    if not any(getattr(e, "identifier", None) == TASKS_EXTENSION for e in extensions):
        extensions.append(TasksClientExtension())

    def open_client() -> Client:
        return Client(server, extensions=extensions, **options)

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

    - `client`: a connected `mcp.Client`, or a factory of them (e.g. `lambda: Client(url, extensions=[...])`).
      With a factory, `follow` owns its connections: when one is lost it opens another and resumes the
      same job from the journal (at most `retries` failures in a row). With a client, it retries on that
      client; note that the SDK's Streamable HTTP transport cancels the code inside `async with Client(url)`
      when it cannot reach the server, which only a factory can recover from.
    - `key`: the caller's stable name for this unit of work (default: a fresh one, which cannot be resumed).
      With a `journal` (a `Journal` or a path), a later call with the same key resumes the same job.
    - `deadline`: seconds (or a `timedelta`) from now, or an aware `datetime`; absolute for this call.
    - `on_input(key, message, requested_schema)` answers the job's questions; None declines (cancels the job).
    - `cancel_on_abandon`: cancel the job when this call stops following it before it ends (deadline,
      cancellation of the caller, a missing or failing input callback). A lost connection is not abandonment.
    - `prefer`: "auto" (Tasks when both sides support it, else the handle tools), "tasks" or "handles".
    - `server_id`: the server's stable name in the journal (default: the client's URL or command line,
      else the server's announced name). Set it when the same server is reached at changing addresses.

    Raises `JobFailedError`, `JobToolError`, `JobCancelledError`, `DeadlineExceeded`, `JobLostError`,
    `ConnectionLostError`, `StartRefusedError`, `InputRequiredError`, `AnswerRejectedError`,
    `OutcomeUnknownError`, `JournalConflict` or `UnsupportedServerError` (all `FollowError`).
    """
    if prefer not in ("auto", "tasks", "handles"):
        raise ValueError("prefer must be 'auto', 'tasks' or 'handles'")
    book = (
        journal if isinstance(journal, Journal) else Journal(journal if journal is not None else ":memory:")
    )
    follower = _Follower(
        client=client,
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


@dataclass
class _View:
    """One observation of the job, whichever face it came from."""

    status: str
    message: str | None = None
    done: float | None = None
    total: float | None = None
    questions: dict[str, Question] = field(default_factory=dict)
    poll_seconds: float | None = None
    task: DetailedTask | None = None

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL_STATUSES


def _caller_error(result: CallToolResult) -> dict[str, Any]:
    """The JSON body of a handle tool's caller error (or its text as the message)."""
    text = "\n".join(block.text for block in result.content if isinstance(block, TextContent))
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        body = None
    return body if isinstance(body, dict) else {"error": "tool_error", "message": text or "The call failed."}


class _HandleFace:
    """The handle tools: `<job>_progress` (long-poll), `<job>_respond`, `<job>_cancel`, `<job>_fetch`."""

    def __init__(self, follower: _Follower, handle: str) -> None:
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
        result = await client.call_tool(
            f"{self.f.job}_{verb}",
            {"handle": self.handle, **arguments},
            read_timeout_seconds=wait + self.f.request_timeout,
        )
        if result.is_error and result.structured_content is None:
            body = _caller_error(result)
            if body.get("error") in _LOST_CODES:
                raise JobLostError(str(body.get("message")), key=self.f.key, handle=self.handle)
            if body.get("retryable"):
                raise _Retryable(str(body.get("message")))
            raise refused(str(body.get("message")), key=self.f.key, handle=self.handle)
        return result

    async def observe(self, client: Client, wait: float) -> _View:
        result = await self._call(client, "progress", {"wait_seconds": round(wait, 3)}, wait)
        data = result.structured_content or {}
        progress = data.get("progress") or {}
        questions = {
            key: Question(key, str(request.get("message", "")), dict(request.get("requested_schema") or {}))
            for key, request in (data.get("input_requests") or {}).items()
        }
        poll = data.get("poll_after_ms")
        return _View(
            status=str(data.get("status")),
            message=data.get("status_message"),
            done=progress.get("done"),
            total=progress.get("total"),
            questions=questions,
            poll_seconds=None if poll is None else poll / 1000,
        )

    async def answer(self, client: Client, answers: dict[str, dict[str, Any]]) -> None:
        await self._call(client, "respond", {"responses": answers}, refused=AnswerRejectedError)

    async def decline(self, client: Client, keys: list[str]) -> None:
        # The handle tools have no "declined" answer: a job cannot go on without it, so it is cancelled.
        await self.cancel(client)

    async def cancel(self, client: Client) -> None:
        await self._call(client, "cancel", {})

    async def outcome(self, client: Client, view: _View) -> dict[str, Any]:
        result = await self._call(client, "fetch", {"wait_seconds": 0})
        data = result.structured_content or {}
        status = str(data.get("status"))
        if status == "completed":
            if data.get("tool_error") is not None:
                return {"status": status, "tool_error": data["tool_error"]}
            return {"status": status, "result": data.get("result")}
        if status == "failed":
            return {
                "status": status,
                "error": data.get("error") or {"code": INTERNAL_ERROR, "message": "failed"},
            }
        return {"status": status, "message": data.get("status_message")}


class _TaskFace:
    """The Tasks extension: `tasks/get`, `tasks/update`, `tasks/cancel` on the handle as `taskId`."""

    def __init__(self, follower: _Follower, handle: str) -> None:
        self.f = follower
        self.handle = handle

    def _lost(self, error: MCPError) -> FollowError:
        if error.error.code == INVALID_PARAMS:
            return JobLostError(error.error.message, key=self.f.key, handle=self.handle)
        return FollowError(error.error.message, key=self.f.key, handle=self.handle)

    async def observe(self, client: Client, wait: float) -> _View:
        try:
            task = await get_task(client.session, self.handle, timeout=self.f.request_timeout)
        except MCPError as error:
            if error.error.code in _TRANSIENT_MCP_CODES:
                raise
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
        return _View(
            status=task.status,
            message=task.status_message,
            questions=questions,
            poll_seconds=None if task.poll_interval_ms is None else task.poll_interval_ms / 1000,
            task=task,
        )

    async def _update(self, client: Client, responses: dict[str, Any]) -> None:
        try:
            await update_task(client.session, self.handle, responses, timeout=self.f.request_timeout)
        except MCPError as error:
            if error.error.code in _TRANSIENT_MCP_CODES:
                raise
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
            if error.error.code in _TRANSIENT_MCP_CODES:
                raise
            raise self._lost(error) from None

    async def outcome(self, client: Client, view: _View) -> dict[str, Any]:
        task = view.task
        assert task is not None
        if task.status == "completed":
            result = task.result or {}
            if result.get("isError"):
                return {"status": "completed", "tool_error": _text_of(result)}
            return {"status": "completed", "result": _structured(result)}
        if task.status == "failed":
            error = task.error or {
                "code": INTERNAL_ERROR,
                "message": task.status_message or "The task failed.",
            }
            return {"status": "failed", "error": error}
        return {"status": "cancelled", "message": task.status_message}


def _text_of(result: dict[str, Any]) -> str:
    parts = [
        b.get("text", "")
        for b in result.get("content") or []
        if isinstance(b, dict) and b.get("type") == "text"
    ]
    return "\n".join(p for p in parts if p) or "The job reported an error."


def _structured(result: dict[str, Any]) -> Any:
    """The structured content of a `CallToolResult` dict, else the whole result."""
    structured = result.get("structuredContent")
    return structured if structured is not None else result


_Face = _HandleFace | _TaskFace


class _Follower:
    def __init__(
        self,
        *,
        client: Client | Connect,
        job: str,
        arguments: dict[str, Any],
        key: str,
        journal: Journal,
        on_progress: ProgressCallback | None,
        on_input: InputCallback | None,
        seconds: float | None,
        cancel_on_abandon: bool,
        prefer: Prefer,
        server_id: str | None,
        long_poll: float,
        request_timeout: float,
        retries: int,
        jitter: float,
    ) -> None:
        self.client: Client | None = client if isinstance(client, Client) else None
        self.connect: Connect | None = None if isinstance(client, Client) else client
        self.job = job
        self.arguments = arguments
        self.key = key
        self.journal = journal
        self.on_progress = on_progress
        self.on_input = on_input
        self.seconds = seconds
        self.cancel_on_abandon = cancel_on_abandon
        self.prefer = prefer
        self.server_id = server_id
        self.server: str | None = None
        self.long_poll = long_poll
        self.request_timeout = request_timeout
        self.retries = retries
        self.jitter = jitter
        self.digest = arguments_digest(job, arguments)
        self.handle: str | None = None
        self.status: str | None = None
        self.interval = DEFAULT_POLL_SECONDS
        self._last_report: Progress | None = None
        self.face: _Face | None = None
        self.deadline_at: float | None = None
        self._failures = 0
        self._answers: dict[str, dict[str, Any] | None] = {}

    # -- the whole call ------------------------------------------------------------------

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
        tools = await self._with_retries(_tool_names)
        use_tasks = self._choose(tools)
        via = "start" if f"{self.job}_start" in tools else "call"
        if via == "call" and not use_tasks:
            raise UnsupportedServerError(
                f"The server lists no {self.job}_start, and this client cannot create a task for {self.job}.",
                key=self.key,
            )
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
                outcome = await self._create_task()
                if outcome is not None:
                    return outcome
            else:
                first_poll = await self._start(entry)
        assert self.handle is not None
        self.face = _TaskFace(self, self.handle) if use_tasks else _HandleFace(self, self.handle)
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

    def _choose(self, tools: set[str]) -> bool:
        """Whether to follow through the Tasks extension (else the handle tools)."""
        client = self._client
        declared = any(getattr(e, "identifier", None) == TASKS_EXTENSION for e in client.extensions or ())
        modern = client.protocol_version in MODERN_PROTOCOL_VERSIONS
        offered = TASKS_EXTENSION in (client.server_capabilities.extensions or {})
        tasks_ok = declared and modern and offered
        handles_ok = f"{self.job}_progress" in tools
        if self.prefer == "tasks" and not tasks_ok:
            why = (
                "the server does not advertise it"
                if declared and modern
                else "this client does not declare it (Client(..., extensions=[TasksClientExtension()]))"
            )
            raise UnsupportedServerError(f"prefer='tasks' but {why}.", key=self.key)
        if self.prefer == "handles" and not handles_ok:
            raise UnsupportedServerError(
                f"prefer='handles' but the server lists no {self.job}_progress.", key=self.key
            )
        if self.prefer == "auto" and not (tasks_ok or handles_ok):
            raise UnsupportedServerError(
                f"The server offers no way to follow {self.job}: no {self.job}_progress tool and no Tasks extension.",
                key=self.key,
            )
        return self.prefer == "tasks" or (self.prefer == "auto" and tasks_ok)

    # -- creating ----------------------------------------------------------------------------

    async def _start(self, entry: JournalEntry) -> float:
        """`<job>_start` with the journal's idempotency key; re-sent with the same key after a lost answer."""
        arguments = {**self.arguments, "idempotency_key": entry.idempotency_key}

        async def start(client: Client) -> CallToolResult:
            result = await client.call_tool(
                f"{self.job}_start", arguments, read_timeout_seconds=self.request_timeout
            )
            if result.is_error:
                body = _caller_error(result)
                if body.get("retryable") and body.get("error") != "limit_reached":
                    raise _Retryable(str(body.get("message")))
                self.journal.forget(self.key)  # nothing was started: the key is free again
                raise StartRefusedError(body, key=self.key)
            return result

        result = await self._with_retries(start)
        data = result.structured_content or {}
        self.handle = str(data["handle"])
        self.status = str(data.get("status"))
        self.journal.set_handle(self.key, self.handle, self.status)
        if not data.get("created", True):
            logger.info("%s: the server returned the job already started with this idempotency key", self.key)
        hint = data.get("poll_after_ms")
        if isinstance(hint, int | float):
            self.interval = max(MIN_POLL_SECONDS, hint / 1000)
        await self._report(_View(status=self.status, message=data.get("status_message")))
        return anyio.current_time()

    async def _create_task(self) -> dict[str, Any] | None:
        """`tools/call <job>` declaring the extension: sent once; an unknown outcome is reported, never retried."""
        try:
            created = await self._client.session.call_tool(
                self.job, self.arguments, read_timeout_seconds=self.request_timeout, allow_claimed=True
            )
        except Exception as exc:
            if _transient(exc):
                raise self._unknown() from exc
            self.journal.forget(self.key)
            if isinstance(exc, MCPError):
                raise StartRefusedError(exc.error.model_dump(mode="json"), key=self.key) from exc
            raise
        if isinstance(created, CreateTaskResult):
            self.handle = created.task_id
            self.status = created.status
            self.journal.set_handle(self.key, self.handle, created.status)
            if created.poll_interval_ms is not None:
                self.interval = max(MIN_POLL_SECONDS, created.poll_interval_ms / 1000)
            return None
        if isinstance(created, CallToolResult):
            # The server answered at once instead of creating a task.
            raw = created.model_dump(by_alias=True, mode="json", exclude_none=True)
            if created.is_error:
                return self._settle(self._finish({"status": "completed", "tool_error": _text_of(raw)}))
            return self._settle(self._finish({"status": "completed", "result": _structured(raw)}))
        self.journal.forget(self.key)
        raise UnsupportedServerError(
            f"Unexpected answer to tools/call {self.job}: {type(created).__name__}", key=self.key
        )

    # -- watching ------------------------------------------------------------------------------

    async def _watch(self, first_poll: float | None) -> dict[str, Any]:
        face = self.face
        assert face is not None
        last_poll = first_poll
        answered: set[str] = set()
        while True:
            if last_poll is not None:
                # Never sooner than the server's hint; the jitter only ever adds to it.
                spacing = self.interval * (1 + self.jitter * random.random())
                await anyio.sleep(max(0.0, last_poll + spacing - anyio.current_time()))
            last_poll = anyio.current_time()
            wait = self.long_poll if isinstance(face, _HandleFace) else 0.0
            if self.deadline_at is not None:
                wait = max(0.0, min(wait, self.deadline_at - anyio.current_time()))
            view = await self._with_retries(functools.partial(face.observe, wait=wait))
            if view.poll_seconds is not None:
                self.interval = max(MIN_POLL_SECONDS, view.poll_seconds)
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

    async def _answer(self, face: _Face, fresh: dict[str, Question]) -> None:
        """Ask the callback (once per question, even across reconnections), then send the answers back."""
        assert self.handle is not None
        for key, question in fresh.items():
            if key in self._answers:
                continue
            if self.on_input is None:
                raise InputRequiredError(list(fresh.values()), key=self.key, handle=self.handle)
            answer = self.on_input(key, question.message, question.requested_schema)
            if inspect.isawaitable(answer):
                answer = await answer
            self._answers[key] = None if answer is None else dict(answer)
        declined = [key for key in fresh if self._answers[key] is None]
        if declined:
            await self._with_retries(functools.partial(face.decline, keys=declined))
            return
        answers = {key: answer for key in fresh if (answer := self._answers[key]) is not None}
        await self._with_retries(functools.partial(face.answer, answers=answers))

    async def _report(self, view: _View) -> None:
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

    # -- outcomes ------------------------------------------------------------------------------

    def _finish(self, outcome: dict[str, Any]) -> dict[str, Any]:
        self.status = str(outcome["status"])
        self.journal.finish(self.key, self.status, outcome)
        return outcome

    def _settle(self, outcome: dict[str, Any]) -> dict[str, Any]:
        """The recorded outcome as a return value or the matching error."""
        status = outcome.get("status")
        handle = self.handle or _journal_handle(self.journal, self.key)
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
            exc, JobLostError | ConnectionLostError | JobFailedError | JobToolError | JobCancelledError
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

    # -- the connection ------------------------------------------------------------------------

    async def _with_retries(self, operation: Callable[[Client], Awaitable[T]]) -> T:
        """Run `operation`; after a transient failure, back off and retry it (with a factory: on a new client)."""
        while True:
            try:
                result = await operation(self._client)
            except Exception as exc:
                if self.connect is not None or not _transient(exc):
                    raise
                await self._failed(exc)
                continue
            self._failures = 0
            return result

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
        pause = min(8.0, 0.5 * 2 ** (self._failures - 1)) * (1 + self.jitter * random.random())
        logger.info("%s: %s; retrying in %.1f s", self.key, _describe(exc), pause)
        await anyio.sleep(pause)


def _journal_handle(journal: Journal, key: str) -> str | None:
    entry = journal.get(key)
    return None if entry is None else entry.handle


async def _tool_names(client: Client) -> set[str]:
    names: set[str] = set()
    cursor: str | None = None
    for _ in range(100):
        page = await client.list_tools(cursor=cursor)
        names.update(tool.name for tool in page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return names


def _transient(exc: BaseException) -> bool:
    if isinstance(
        exc, _Retryable | OSError | TimeoutError | anyio.BrokenResourceError | anyio.ClosedResourceError
    ):
        return True
    if isinstance(exc, anyio.EndOfStream):
        return True
    return isinstance(exc, MCPError) and exc.error.code in _TRANSIENT_MCP_CODES


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _follow_error_in(exc: BaseException) -> FollowError | None:
    """A `FollowError` raised inside a client's task group comes out wrapped in an exception group."""
    return next((leaf for leaf in _leaves(exc) if isinstance(leaf, FollowError)), None)


def _connection_failure(exc: BaseException) -> bool:
    """A transient error, or a transport's crash (e.g. `httpx2.ConnectError` out of the client's task group)."""
    return any(
        _transient(leaf)
        or type(leaf).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore", "httpcore2")
        for leaf in _leaves(exc)
    )


def _describe(exc: BaseException) -> str:
    leaves = _leaves(exc)
    if len(leaves) == 1 and leaves[0] is not exc:
        exc = leaves[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
