"""The client side of the Tasks extension for the official `mcp` client (`TasksClientExtension`, `follow_task`, ...)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import anyio
from mcp.client.extension import ClaimContext, ClientExtension, NotificationBinding, ResultClaim
from mcp.client.session import ClientRequestContext, ClientSession
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CallToolResult,
    ErrorData,
    InputRequest,
    InputResponse,
)

from handles.backoff import backoff_seconds
from handles.client.task_messages import (
    TERMINAL_STATUSES,
    CreateTaskResult,
    DetailedTask,
    TaskCancelled,
    TaskFailed,
    TaskStatus,
    cancel_task,
    get_task,
    update_task,
)
from handles.client.task_pushes import (
    PUSHED_RECHECK_SECONDS,
    PushedStatus,
    TaskPushes,
    TaskStatusParams,
    TaskSubscription,
    listen_tasks,
    pushed_status,
)
from handles.client.transient import (
    CANCEL_TIMEOUT_SECONDS,
    authentication_error,
    is_transient,
)
from handles.client.transient import AuthenticationError as AuthenticationError  # raised here, re-exported
from handles.tasks_wire import TASKS_EXTENSION

__all__ = [
    "DEFAULT_POLL_SECONDS",
    "DEFAULT_RETRIES",
    "PUSHED_RECHECK_SECONDS",
    "TERMINAL_STATUSES",
    "AuthenticationError",
    "CreateTaskResult",
    "DetailedTask",
    "InputHandler",
    "PushedStatus",
    "TaskCancelled",
    "TaskFailed",
    "TaskObserver",
    "TaskPushes",
    "TaskStatus",
    "TaskStatusParams",
    "TaskSubscription",
    "TasksClientExtension",
    "cancel_task",
    "follow_task",
    "get_task",
    "listen_tasks",
    "pushed_status",
    "session_input_handler",
    "update_task",
]

logger = logging.getLogger("handles.client.tasks")
T = TypeVar("T")

DEFAULT_POLL_SECONDS = 1.0
DEFAULT_RETRIES = 3

InputHandler = Callable[[str, InputRequest], Awaitable[InputResponse | ErrorData]]
"""`(key, request) -> response` for one entry of a task's `inputRequests`; `ErrorData` refuses it."""

TaskObserver = Callable[["DetailedTask"], Awaitable[None] | None]
"""Called with each `tasks/get` answer while a task is followed (`status`, `status_message`, `done`, `total`)."""


def session_input_handler(session: ClientSession) -> InputHandler:
    """Answer input requests with the client's own sampling / elicitation / roots callbacks."""

    async def handle(key: str, request: InputRequest) -> InputResponse | ErrorData:
        meta = request.params.meta if request.params is not None else None
        return await session.dispatch_input_request(
            ClientRequestContext(session=session, request_id=key, meta=meta), request
        )

    return handle


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
    """Follow a task to its end and return its `CallToolResult`.

    States come from pushes when `pushes` is given and the server offers them, else from `tasks/get`.
    Transient failures are retried up to `retries` in a row; the task is cancelled only when the
    caller gives up (its cancellation or deadline, or an input handler that refuses or fails).
    """
    task_id = task if isinstance(task, str) else task.task_id
    hint = None if isinstance(task, str) else task.poll_interval_ms
    answer = on_input or session_input_handler(session)
    answered: set[str] = set()
    first = True
    polled = False
    try:
        async with pushed_status(session, pushes, task_id) as status:
            while True:
                state = None
                if status.pushed:
                    # The first push (the state at the acknowledgement) comes at once from a handles server.
                    state = await status.wait_push(
                        (hint / 1000 if hint else default_poll_seconds) if first else recheck_seconds
                    )
                elif polled:
                    await anyio.sleep(hint / 1000 if hint else default_poll_seconds)
                first = False
                if state is None:
                    state = await _retrying(
                        lambda: get_task(session, task_id, timeout=request_timeout), retries
                    )
                polled = True
                hint = state.poll_interval_ms or hint
                if on_progress is not None and inspect.isawaitable(seen := on_progress(state)):
                    await seen
                if state.status in TERMINAL_STATUSES:
                    return _outcome(state)
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


def _outcome(state: DetailedTask) -> CallToolResult:
    if state.status == "completed":
        return CallToolResult.model_validate(state.result or {"content": []}, by_name=False)
    if state.status == "failed":
        raise TaskFailed(state)
    raise TaskCancelled(state)


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
