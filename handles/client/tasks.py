"""The client side of the Tasks extension for the official `mcp` client: its messages, pushed task status,
`follow_task` and `TasksClientExtension`."""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import anyio
from mcp.client.extension import ClaimContext, ClientExtension, NotificationBinding, ResultClaim
from mcp.client.session import ClientRequestContext, ClientSession
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    CallToolResult,
    ErrorData,
    InputRequest,
    InputResponse,
    NotificationParams,
    Request,
    RequestParams,
    Result,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ConfigDict, TypeAdapter, ValidationError

from handles.backoff import backoff_seconds
from handles.client.transient import CANCEL_TIMEOUT_SECONDS, authentication_error, is_transient
from handles.client.transient import AuthenticationError as AuthenticationError  # raised here, re-exported
from handles.tasks_wire import PROGRESS_META_KEY, TASKS_EXTENSION

logger = logging.getLogger("handles.client.tasks")
T = TypeVar("T")

DEFAULT_POLL_SECONDS = 1.0
DEFAULT_RETRIES = 3
PUSHED_RECHECK_SECONDS = 30.0
"""While a task's status is pushed, a `tasks/get` is still sent after this long without a push (a
server may stop pushing, e.g. while it drains, and keep the stream open)."""
ACK_TIMEOUT_SECONDS = 10.0

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]
TERMINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "cancelled"})

_INPUT_REQUEST: TypeAdapter[InputRequest] = TypeAdapter(InputRequest)
_listen_ids = itertools.count(1)
_SESSION_INTERNALS = (
    "_task_group",
    "_stamp",
    "_dispatcher",
    "_register_listen_route",
    "_unregister_listen_route",
)
"""The private `ClientSession` members `listen_tasks` drives (those of `mcp.client.subscriptions.listen`)."""

InputHandler = Callable[[str, InputRequest], Awaitable[InputResponse | ErrorData]]
"""`(key, request) -> response` for one entry of a task's `inputRequests`; `ErrorData` refuses it."""

TaskObserver = Callable[["DetailedTask"], Awaitable[None] | None]
"""Called with each `tasks/get` answer while a task is followed (`status`, `status_message`, `done`, `total`)."""


class TaskResultBase(Result):
    """The `Task` fields shared by `CreateTaskResult` and the `tasks/get` answer."""

    task_id: str
    status: TaskStatus
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None

    @property
    def done(self) -> float | None:
        """Work done so far, when the server reports it under `PROGRESS_META_KEY` (a `handles` server does)."""
        return _progress_number(self.meta, "done")

    @property
    def total(self) -> float | None:
        """The total the job announced with its progress, if any."""
        return _progress_number(self.meta, "total")


def _progress_number(meta: dict[str, Any] | None, name: str) -> float | None:
    progress = (meta or {}).get(PROGRESS_META_KEY)
    value = progress.get(name) if isinstance(progress, dict) else None
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


class CreateTaskResult(TaskResultBase):
    """A `tools/call` answered with a task (flat: the task fields and `resultType: "task"`)."""

    result_type: Literal["task"] = "task"


class DetailedTask(TaskResultBase):
    """A `tasks/get` answer: the task plus what its status carries."""

    result_type: str = "complete"
    input_requests: dict[str, dict[str, Any]] | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None

    def pending_requests(self) -> dict[str, InputRequest]:
        """The outstanding input requests, parsed (empty unless `input_required`)."""
        return {
            key: _INPUT_REQUEST.validate_python(value) for key, value in (self.input_requests or {}).items()
        }


class TaskParams(RequestParams):
    """`{taskId}`, and `inputResponses` for `tasks/update` (its result models dumped with the request)."""

    task_id: str
    input_responses: dict[str, Any] | None = None


class TaskRequest(Request[TaskParams, Literal["tasks/get", "tasks/update", "tasks/cancel"]]):
    name_param = "taskId"  # Streamable HTTP: Mcp-Name carries the taskId


class Ack(Result):
    result_type: str = "complete"


class TaskFailed(MCPError):
    """The task ended `failed`: carries its JSON-RPC error (the error the call would have returned)."""

    def __init__(self, task: DetailedTask) -> None:
        error = task.error or {}
        super().__init__(
            code=int(error.get("code", INTERNAL_ERROR)),
            message=str(error.get("message") or task.status_message or "The task failed."),
            data=error.get("data"),
        )
        self.task = task


class TaskCancelled(RuntimeError):
    """The task ended `cancelled` without a result."""

    def __init__(self, task: DetailedTask) -> None:
        super().__init__(task.status_message or "The task was cancelled.")
        self.task = task


async def get_task(session: ClientSession, task_id: str, *, timeout: float | None = None) -> DetailedTask:
    request = TaskRequest(method="tasks/get", params=TaskParams(task_id=task_id))
    return await session.send_request(request, DetailedTask, request_read_timeout_seconds=timeout)


async def update_task(
    session: ClientSession, task_id: str, responses: dict[str, Any], *, timeout: float | None = None
) -> None:
    """Send answers; `responses` maps input-request keys to results (e.g. `ElicitResult`s or plain dicts)."""
    params = TaskParams(task_id=task_id, input_responses=responses)
    request = TaskRequest(method="tasks/update", params=params)
    await session.send_request(request, Ack, request_read_timeout_seconds=timeout)


async def cancel_task(session: ClientSession, task_id: str, *, timeout: float | None = None) -> None:
    request = TaskRequest(method="tasks/cancel", params=TaskParams(task_id=task_id))
    await session.send_request(request, Ack, request_read_timeout_seconds=timeout)


async def send_unchecked(
    session: ClientSession,
    method: str,
    params: dict[str, Any],
    headers: dict[str, str] | None = None,
    **call: Any,
) -> dict[str, Any]:
    """`method` stamped as the session stamps every request (plus `headers`), its answer returned unchecked
    (such as a 2025-11-25 `tools/call` answered with a task); `call` holds the dispatcher's options."""
    data: dict[str, Any] = {"method": method, "params": params}
    options: Any = call
    session._stamp(data, options)  # pyright: ignore[reportPrivateUsage]
    if headers:
        options.setdefault("headers", {}).update(headers)
    answer: dict[str, Any] = await session._dispatcher.send_raw_request(  # pyright: ignore[reportPrivateUsage]
        method, data["params"], options
    )
    return answer


class TaskStatusParams(NotificationParams):
    """`notifications/tasks` params: a `DetailedTask` (kept whole; read with `DetailedTask`)."""

    model_config = ConfigDict(extra="allow")


class TaskPushes:
    """The latest pushed state of each task a follower listens for (older or post-terminal states dropped), and wake-ups."""

    def __init__(self) -> None:
        self._latest: dict[str, DetailedTask] = {}
        self._wake: dict[str, anyio.Event] = {}
        self._watching: Counter[str] = Counter()
        self.received = 0
        """How many `notifications/tasks` were kept (for measurements)."""

    async def deliver(self, params: TaskStatusParams) -> None:
        try:
            state = DetailedTask.model_validate(params.model_dump(by_alias=True), by_name=False)
        except ValidationError:
            logger.warning("ignored a malformed notifications/tasks")
            return
        if state.task_id not in self._watching:
            return
        known = self._latest.get(state.task_id)
        if known is not None and (
            known.status in TERMINAL_STATUSES or state.last_updated_at < known.last_updated_at
        ):
            return
        self.received += 1
        self._latest[state.task_id] = state
        event = self._wake.pop(state.task_id, None)
        if event is not None:
            event.set()

    @contextlib.contextmanager
    def watching(self, task_id: str) -> Any:
        """Keep the states pushed for `task_id` while inside (nested uses are counted)."""
        self._watching[task_id] += 1
        try:
            yield
        finally:
            self._watching[task_id] -= 1
            if self._watching[task_id] <= 0:
                del self._watching[task_id]
                self._latest.pop(task_id, None)
                self._wake.pop(task_id, None)

    def latest(self, task_id: str) -> DetailedTask | None:
        return self._latest.get(task_id)

    async def changed(self, task_id: str, seen: DetailedTask | None) -> DetailedTask:
        """The latest pushed state of `task_id` once it is not `seen` (the one returned last time)."""
        while True:
            current = self._latest.get(task_id)
            if current is not None and current is not seen:
                return current
            await self._wake.setdefault(task_id, anyio.Event()).wait()


@dataclass(eq=False)
class TaskSubscription:
    """One `subscriptions/listen` stream asking for `taskIds`: which the server pushes, and whether it is open."""

    honored: frozenset[str]
    _route: Any = None

    @property
    def live(self) -> bool:
        return self._route is not None and self._route.end is None


@contextlib.asynccontextmanager
async def listen_tasks(
    session: ClientSession, task_ids: Collection[str], *, ack_timeout: float = ACK_TIMEOUT_SECONDS
) -> AsyncIterator[TaskSubscription]:
    """Open a `subscriptions/listen` stream for `task_ids` (2026-07-28 only) while inside; a task the server
    does not acknowledge is left out of `honored` (its follower polls)."""
    if session.protocol_version not in MODERN_PROTOCOL_VERSIONS or not task_ids:
        yield TaskSubscription(frozenset())
        return
    if not all(hasattr(session, name) for name in _SESSION_INTERNALS):
        logger.debug("this mcp version's session lacks the listen internals; tasks are polled")
        yield TaskSubscription(frozenset())
        return
    task_group = session._task_group  # pyright: ignore[reportPrivateUsage]
    if task_group is None:
        raise RuntimeError("listen_tasks() requires an entered session")
    request_id = f"tasks-listen-{next(_listen_ids)}"
    params = {"notifications": {"taskIds": list(task_ids)}}
    driver_scope = anyio.CancelScope()
    route = session._register_listen_route(request_id)  # pyright: ignore[reportPrivateUsage]

    async def drive() -> None:
        with driver_scope:
            try:
                await send_unchecked(session, "subscriptions/listen", params, request_id=request_id)
            except Exception as error:
                route.settle("lost", error=error if isinstance(error, MCPError) else None)
                return
            route.settle("graceful")

    try:
        task_group.start_soon(drive)
        with anyio.move_on_after(ack_timeout):
            await route.acked.wait()
        honored: frozenset[str] = frozenset()
        if route.honored is not None and route.end is None:
            named = (route.honored.model_extra or {}).get("taskIds")
            if isinstance(named, list):
                honored = frozenset(task_id for task_id in named if task_id in task_ids)
        elif route.error is not None:
            logger.debug("the server pushes no task status: %s", route.error)
        yield TaskSubscription(honored, route)
    finally:
        route.settle("local")
        driver_scope.cancel()
        session._unregister_listen_route(request_id)  # pyright: ignore[reportPrivateUsage]


@dataclass(eq=False)
class PushedStatus:
    """One task followed through pushed states, with `tasks/get` where the push is missing."""

    pushes: TaskPushes | None
    subscription: TaskSubscription
    task_id: str
    recheck: float = PUSHED_RECHECK_SECONDS
    _seen: DetailedTask | None = field(init=False, default=None)
    _waited: bool = field(init=False, default=False)

    @property
    def pushed(self) -> bool:
        """Whether the server pushes this task's states on a stream still open."""
        return (
            self.pushes is not None and self.task_id in self.subscription.honored and self.subscription.live
        )

    async def wait_push(self, first: float) -> DetailedTask | None:
        """The next pushed state, or None once the push stops or the wait runs out: `first` seconds the
        first time (a handles server pushes the state at the acknowledgement at once), `recheck` after."""
        pushes = self.pushes
        deadline = anyio.current_time() + (self.recheck if self._waited else first)
        self._waited = True
        while pushes is not None and self.pushed and (left := deadline - anyio.current_time()) > 0:
            # In slices: a stream that ends sets no event here.
            with anyio.move_on_after(min(left, 1.0)):
                state = await pushes.changed(self.task_id, self._seen)
                self._seen = state
                return state
        return None


@contextlib.asynccontextmanager
async def pushed_status(
    session: ClientSession, pushes: TaskPushes | None, task_id: str, recheck: float = PUSHED_RECHECK_SECONDS
) -> AsyncIterator[PushedStatus]:
    """Listen for `task_id`'s pushed states while inside (when there is a binding to receive them)."""
    if pushes is None:
        yield PushedStatus(None, TaskSubscription(frozenset()), task_id, recheck)
        return
    with pushes.watching(task_id):
        async with listen_tasks(session, [task_id]) as subscription:
            yield PushedStatus(pushes, subscription, task_id, recheck)


async def _session_answer(
    session: ClientSession, key: str, request: InputRequest
) -> InputResponse | ErrorData:
    """Answer an input request with the client's own sampling / elicitation / roots callbacks."""
    meta = request.params.meta if request.params is not None else None
    context = ClientRequestContext(session=session, request_id=key, meta=meta)
    return await session.dispatch_input_request(context, request)


async def follow_task(
    session: ClientSession,
    task: CreateTaskResult | str,
    *,
    on_input: InputHandler | None = None,
    request_timeout: float | None = None,
    default_poll_seconds: float = DEFAULT_POLL_SECONDS,
    on_progress: TaskObserver | None = None,
    retries: int = DEFAULT_RETRIES,
    pushes: TaskPushes | None = None,
    recheck_seconds: float = PUSHED_RECHECK_SECONDS,
) -> CallToolResult:
    """Follow a task to its end and return its `CallToolResult`, from pushed states or `tasks/get`, retrying
    transient failures; the task is cancelled only when the caller gives up (or its input handler fails)."""
    task_id = task if isinstance(task, str) else task.task_id
    hint = None if isinstance(task, str) else task.poll_interval_ms
    answer = on_input or functools.partial(_session_answer, session)
    answered: set[str] = set()
    polled = False
    try:
        async with pushed_status(session, pushes, task_id, recheck_seconds) as status:
            while True:
                state = None
                if status.pushed:
                    state = await status.wait_push(hint / 1000 if hint else default_poll_seconds)
                elif polled:
                    await anyio.sleep(hint / 1000 if hint else default_poll_seconds)
                if state is None:
                    state = await _retrying(
                        lambda: get_task(session, task_id, timeout=request_timeout), retries
                    )
                polled = True
                hint = state.poll_interval_ms or hint
                if on_progress is not None and inspect.isawaitable(seen := on_progress(state)):
                    await seen
                if state.status == "completed":
                    return CallToolResult.model_validate(state.result or {"content": []}, by_name=False)
                if state.status == "failed":
                    raise TaskFailed(state)
                if state.status == "cancelled":
                    raise TaskCancelled(state)
                if state.status == "input_required":
                    fresh = {k: v for k, v in state.pending_requests().items() if k not in answered}
                    if fresh:
                        try:
                            responses = {
                                key: _accepted(await answer(key, request)) for key, request in fresh.items()
                            }
                        except Exception:
                            await _abandon(session, task_id)  # the caller's handler refused or failed
                            raise
                        send = functools.partial(
                            update_task, session, task_id, responses, timeout=request_timeout
                        )
                        await _retrying(send, retries)
                        answered.update(fresh)
                        polled = False  # look again at once
    except anyio.get_cancelled_exc_class():
        await _abandon(session, task_id)  # the caller's own cancellation, or its deadline
        raise


async def _retrying(request: Callable[[], Awaitable[T]], retries: int) -> T:
    """Send `request`, again after each transient failure (with backoff), at most `retries` times in a row."""
    failures = 0
    while True:
        try:
            return await request()
        except Exception as exc:
            refused = authentication_error(exc)
            if refused is not None:
                raise refused from exc
            if not is_transient(exc) or failures >= retries:
                raise
            failures += 1
            pause = backoff_seconds(failures)
            logger.info("tasks client: %s; retrying in %.1f s", exc, pause)
            await anyio.sleep(pause)


def _accepted(response: InputResponse | ErrorData) -> InputResponse:
    if isinstance(response, ErrorData):
        raise MCPError.from_error_data(response)
    return response


async def _abandon(session: ClientSession, task_id: str) -> None:
    """Best effort, shielded from the cancellation that brought us here."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_TIMEOUT_SECONDS):
        with contextlib.suppress(Exception):
            await cancel_task(session, task_id)
            return
        logger.warning("could not cancel abandoned task %s", task_id)


class TasksClientExtension(ClientExtension):
    """Declares the Tasks extension and resolves `"task"` results of `call_tool` to their final result."""

    identifier = TASKS_EXTENSION

    def __init__(
        self,
        *,
        on_input: InputHandler | None = None,
        default_poll_seconds: float = DEFAULT_POLL_SECONDS,
        on_progress: TaskObserver | None = None,
        push: bool = True,
    ) -> None:
        self.on_input = on_input
        self.default_poll_seconds = default_poll_seconds
        self.on_progress = on_progress
        self.pushes: TaskPushes | None = TaskPushes() if push else None
        """Where `notifications/tasks` land; None (`push=False`): tasks are only polled."""

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return (ResultClaim(result_type="task", model=CreateTaskResult, resolve=self._resolve),)

    def notifications(self) -> Sequence[NotificationBinding[Any]]:
        if self.pushes is None:
            return ()
        return (
            NotificationBinding(
                method="notifications/tasks", params_type=TaskStatusParams, handler=self.pushes.deliver
            ),
        )

    async def _resolve(self, created: CreateTaskResult, ctx: ClaimContext) -> CallToolResult:
        return await follow_task(
            ctx.session,
            created,
            on_input=self.on_input,
            request_timeout=ctx.read_timeout_seconds,
            default_poll_seconds=self.default_poll_seconds,
            on_progress=self.on_progress,
            pushes=self.pushes,
        )
