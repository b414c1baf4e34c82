"""Task status pushed by the server: `notifications/tasks` on a `subscriptions/listen` stream."""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections import Counter
from collections.abc import AsyncIterator, Collection
from typing import Any

import anyio
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from mcp_types import NotificationParams
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ConfigDict, ValidationError

from handles.client.task_messages import TERMINAL_STATUSES, DetailedTask

logger = logging.getLogger("handles.client.tasks")

PUSHED_RECHECK_SECONDS = 30.0
"""While a task's status is pushed, a `tasks/get` is still sent after this long without a push (a
server may stop pushing, e.g. while it drains, and keep the stream open)."""
ACK_TIMEOUT_SECONDS = 10.0
_listen_ids = itertools.count(1)
_SESSION_INTERNALS = (
    "_task_group",
    "_stamp",
    "_dispatcher",
    "_register_listen_route",
    "_unregister_listen_route",
)
"""The private `ClientSession` members `listen_tasks` drives (those of `mcp.client.subscriptions.listen`)."""


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
            event = self._wake.get(task_id)
            if event is None:
                event = self._wake[task_id] = anyio.Event()
            await event.wait()


class TaskSubscription:
    """One `subscriptions/listen` stream asking for `taskIds`: which the server pushes, and whether it is open."""

    def __init__(self, honored: frozenset[str], route: Any = None) -> None:
        self.honored = honored
        self._route = route

    @property
    def live(self) -> bool:
        return self._route is not None and self._route.end is None


@contextlib.asynccontextmanager
async def listen_tasks(
    session: ClientSession, task_ids: Collection[str], *, ack_timeout: float = ACK_TIMEOUT_SECONDS
) -> AsyncIterator[TaskSubscription]:
    """Open a `subscriptions/listen` stream for `task_ids` (2026-07-28 only) while inside.

    Never raises for a server that does not push: a task it does not acknowledge is left out of
    `honored`, and its follower polls.
    """
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
    data: dict[str, Any] = {
        "method": "subscriptions/listen",
        "params": {"notifications": {"taskIds": list(task_ids)}},
    }
    opts: Any = {"request_id": request_id}
    session._stamp(data, opts)  # pyright: ignore[reportPrivateUsage]
    driver_scope = anyio.CancelScope()
    route = session._register_listen_route(request_id)  # pyright: ignore[reportPrivateUsage]

    async def drive() -> None:
        with driver_scope:
            try:
                await session._dispatcher.send_raw_request(  # pyright: ignore[reportPrivateUsage]
                    data["method"], data.get("params"), opts
                )
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


class PushedStatus:
    """One task followed through pushed states, with `tasks/get` where the push is missing."""

    def __init__(self, pushes: TaskPushes | None, subscription: TaskSubscription, task_id: str) -> None:
        self.pushes = pushes
        self.subscription = subscription
        self.task_id = task_id
        self._seen: DetailedTask | None = None

    @property
    def pushed(self) -> bool:
        """Whether the server pushes this task's states on a stream still open."""
        return (
            self.pushes is not None and self.task_id in self.subscription.honored and self.subscription.live
        )

    async def wait_push(self, timeout: float) -> DetailedTask | None:
        """The next pushed state, or None after `timeout` seconds or once the push stops."""
        assert self.pushes is not None
        pushes = self.pushes
        deadline = anyio.current_time() + timeout
        while self.pushed and (left := deadline - anyio.current_time()) > 0:
            # In slices: a stream that ends sets no event here.
            with anyio.move_on_after(min(left, 1.0)):
                state = await pushes.changed(self.task_id, self._seen)
                self._seen = state
                return state
        return None


@contextlib.asynccontextmanager
async def pushed_status(
    session: ClientSession, pushes: TaskPushes | None, task_id: str
) -> AsyncIterator[PushedStatus]:
    """Listen for `task_id`'s pushed states while inside (when there is a binding to receive them)."""
    if pushes is None:
        yield PushedStatus(None, TaskSubscription(frozenset()), task_id)
        return
    with pushes.watching(task_id):
        async with listen_tasks(session, [task_id]) as subscription:
            yield PushedStatus(pushes, subscription, task_id)
