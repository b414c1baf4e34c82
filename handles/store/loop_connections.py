"""PostgreSQL on the event loop itself: psycopg's asynchronous connections for a job's start."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

IDLE = 0
"""libpq's `PQTRANS_IDLE`: a connection with no statement under way and no transaction open."""


class LoopConnections:
    """Up to `size` connections made by `connect`, lent out one at a time on one event loop."""

    def __init__(self, connect: Callable[[], Awaitable[Any]], size: int) -> None:
        self.connect = connect
        self._size = size
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: list[Any] = []
        self._opened = 0  # lent out or idle
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False
        self._binding = threading.Lock()

    def usable(self) -> bool:
        """Whether `connection` may be used on this loop (the connections' own) before `close`."""
        if self._closed:
            return False
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        if self._loop is loop:
            return True
        if _proactor(loop):
            return False  # psycopg's asynchronous connections need a selector loop (Windows' default is not)
        with self._binding:  # two new loops on two threads: one takes the connections, the other is told no
            if self._loop is None or self._loop.is_closed():
                self._drop_idle()  # a closed loop's connections can never be awaited again
                self._opened, self._waiters = 0, deque()
                self._loop = loop
            return self._loop is loop

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        """A connection of this loop's, given back after the block, or closed when left in doubt."""
        connection = await self._take()
        try:
            yield connection
        finally:
            if self._closed or connection.closed or connection.pgconn.transaction_status != IDLE:
                if connection.closed:
                    # Dropped by the server: the idle ones are likely dropped too.
                    self._drop_idle()
                _finish(connection)
                self._opened -= 1
            else:
                self._idle.append(connection)
            self._wake_one()

    def close(self) -> None:
        """Close the idle connections now and each lent one as it comes back; `usable` is False from now on."""
        self._closed = True
        self._drop_idle()

    async def _take(self) -> Any:
        while True:
            if self._idle:
                return self._idle.pop()
            if self._opened < self._size:
                self._opened += 1
                try:
                    return await self.connect()
                except BaseException:
                    self._opened -= 1
                    self._wake_one()
                    raise
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # it was woken for a connection it no longer takes: pass that on
                else:
                    self._waiters.remove(waiter)
                raise

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _drop_idle(self) -> None:
        for connection in self._idle:
            _finish(connection)
        self._opened -= len(self._idle)
        self._idle.clear()


def _proactor(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether `loop` is Windows' `ProactorEventLoop`, on which psycopg cannot wait for a socket."""
    return isinstance(loop, getattr(asyncio, "ProactorEventLoop", ()))


def _finish(connection: Any) -> None:
    """Close `connection` without awaiting (libpq's `PQfinish`)."""
    with contextlib.suppress(Exception):
        connection.pgconn.finish()
