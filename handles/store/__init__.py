"""The store: the repository behind an async facade that keeps the event loop free.

`Store.call` and `Store.write` run repository methods on worker threads; `write`
also wakes every local waiter of the job it changed (long-polls, `ask`). Waiters
in other processes notice within `store_poll_seconds`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import anyio
import anyio.to_thread
from sqlalchemy.exc import DBAPIError, OperationalError

from handles.errors import StoreUnavailable
from handles.store.models import InputRequestRecord, JobRecord, StepRecord
from handles.store.repository import AnswerOutcome, CancelOutcome, Clock, JobRepository, utc_now

__all__ = [
    "AnswerOutcome",
    "CancelOutcome",
    "ChangeNotifier",
    "Clock",
    "InputRequestRecord",
    "JobRecord",
    "JobRepository",
    "StepRecord",
    "Store",
    "utc_now",
]

logger = logging.getLogger("handles.store")

P = ParamSpec("P")
T = TypeVar("T")


class ChangeNotifier:
    """Wakes coroutines of this process that wait for a job to change."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def notify(self, job_id: str) -> None:
        event = self._events.pop(job_id, None)
        if event is not None:
            event.set()

    async def wait(self, job_id: str, timeout: float) -> None:
        """Return when `job_id` changes here, or after `timeout` seconds, whichever is first."""
        event = self._events.get(job_id)
        if event is None:
            event = self._events[job_id] = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout=max(timeout, 0.0))


class Store:
    """Async access to a `JobRepository`; database faults become `StoreUnavailable`."""

    def __init__(self, repository: JobRepository, *, threads: int = 8) -> None:
        self.repo = repository
        self.notifier = ChangeNotifier()
        self._limiter = anyio.CapacityLimiter(threads)

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a repository method that changes nothing anyone waits for (reads, sweeps)."""
        return await self._run(functools.partial(fn, *args, **kwargs))

    async def write(self, job_id: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a repository method that may change `job_id`, then wake its local waiters."""
        try:
            return await self._run(functools.partial(fn, *args, **kwargs))
        finally:
            self.notifier.notify(job_id)

    async def _run(self, call: Callable[[], T]) -> T:
        try:
            return await anyio.to_thread.run_sync(call, limiter=self._limiter)
        except (OperationalError, DBAPIError) as exc:
            if (
                isinstance(exc, DBAPIError)
                and not isinstance(exc, OperationalError)
                and not exc.connection_invalidated
            ):
                raise
            logger.warning("database unavailable: %s", exc.__class__.__name__)
            raise StoreUnavailable(
                "The job store is unavailable right now; nothing was changed.",
                "Retry the same call in a few seconds.",
            ) from exc
