"""The store: the repository behind an async facade that keeps the event loop free.

`Store.call` and `Store.write` run repository methods on worker threads; `write`
also wakes every local waiter of the job it changed (long-polls, `ask`). Waiters
in other processes notice within `store_poll_seconds`: each process reads the
versions of all the jobs it waits on once per interval (`Store.poll_watched`).
On an SQLite file the reads by key (`read`), a start's insert (`insert`) and a job's outcome
(`write_short`) run on the event loop itself when they need not wait for a lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import weakref
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import anyio
import anyio.to_thread
from sqlalchemy.exc import DBAPIError, OperationalError

from handles.errors import StoreUnavailable
from handles.store.engine import WriterBusy
from handles.store.models import (
    Clock,
    InputRequestRecord,
    JobRecord,
    JobState,
    StepRecord,
    SwitchRecord,
    utc_now,
)
from handles.store.repository import AnswerOutcome, CancelOutcome, JobRepository

__all__ = [
    "AnswerOutcome",
    "CancelOutcome",
    "ChangeNotifier",
    "Clock",
    "InputRequestRecord",
    "JobRecord",
    "JobRepository",
    "JobState",
    "StepRecord",
    "Store",
    "SwitchRecord",
    "utc_now",
]

logger = logging.getLogger("handles.store")

P = ParamSpec("P")
T = TypeVar("T")


class ChangeNotifier:
    """Wakes coroutines of this process that wait for a job to change."""

    def __init__(self) -> None:
        # Weak: an event lives only while a waiter holds it. A job that ends is never notified
        # again, so a plain dict would keep one event per job ever waited on.
        self._events: weakref.WeakValueDictionary[str, asyncio.Event] = weakref.WeakValueDictionary()
        self._seen: dict[str, int] = {}  # job id -> the oldest version its current waiters have read

    def notify(self, job_id: str) -> None:
        self._seen.pop(job_id, None)
        event = self._events.pop(job_id, None)
        if event is not None:
            event.set()

    def notify_all(self) -> None:
        """Wake every waiter of this process (the node is draining: long-polls answer now)."""
        events = list(self._events.values())
        self._events.clear()
        self._seen.clear()
        for event in events:
            event.set()

    def seen(self, job_id: str, version: int) -> None:
        """A waiter of `job_id` has read `version` and now waits for a newer one."""
        self._seen[job_id] = min(version, self._seen.get(job_id, version))

    def watched(self) -> dict[str, int]:
        """The jobs waited on now, each with the oldest version its waiters have read."""
        for job_id in [job_id for job_id in self._seen if job_id not in self._events]:
            del self._seen[job_id]  # its waiters are gone
        return dict(self._seen)

    def watch(self, job_id: str) -> asyncio.Event:
        """The event the next change of `job_id` sets. Take it *before* reading the job, so that a
        change committed between the read and the wait is not missed."""
        event = self._events.get(job_id)
        if event is None:
            event = self._events[job_id] = asyncio.Event()
        return event

    async def wait(self, job_id: str, timeout: float, *, event: asyncio.Event | None = None) -> None:
        """Return when `job_id` changes here (or `event`, from `watch`, is set), or after `timeout` seconds."""
        event = event if event is not None else self.watch(job_id)
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation that lands
        # just as the event is set, and the cancelled waiter would carry on.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(timeout, 0.0)):
                await event.wait()


class Store:
    """Async access to a `JobRepository`; database faults become `StoreUnavailable`."""

    def __init__(self, repository: JobRepository, *, threads: int = 8) -> None:
        self.repo = repository
        self.notifier = ChangeNotifier()
        self.origin = "unnamed"  # the runtime names it; other nodes ignore their own publications
        self._publishes = repository.dialect == "postgresql"
        self._limiter = anyio.CapacityLimiter(threads)

    async def read(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a read-only repository method: on the event loop for an SQLite file, else on a worker thread.

        A read that meets a lock on the loop (rare in WAL mode) is retried on a worker thread.
        """
        if self.repo.reads_inline:
            with contextlib.suppress(OperationalError):
                return self.repo.read_inline(fn, *args, **kwargs)
        return await self._run(functools.partial(fn, *args, **kwargs), repeatable=True)

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a repository method that changes nothing anyone waits for (reads, sweeps)."""
        return await self._run(functools.partial(fn, *args, **kwargs))

    async def write(self, job_id: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a repository method that may change `job_id`, and wake its waiters here and on other nodes.

        On PostgreSQL the change notice goes out in the method's own write transaction (see
        `JobRepository.publishing`): other nodes hear of the change exactly when it commits.
        """
        return await self._write(job_id, False, functools.partial(fn, *args, **kwargs))

    async def write_queued(self, job_id: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Like `write`, for a change that leaves `job_id` waiting for a worker: idle workers on other
        nodes look for it at once."""
        return await self._write(job_id, True, functools.partial(fn, *args, **kwargs))

    async def insert(self, job: JobRecord, *, queued: bool, **options: Any) -> tuple[JobRecord, bool]:
        """Store a new job (`JobRepository.insert` with `options`), as `write` (`write_queued` when it
        waits for a worker) would.

        On an SQLite file the short insert transaction runs here, on the event loop, when the writer
        lock is free in this process and in SQLite (no waiting for either): no hop to a worker thread.
        When a writer is at work it runs on a worker thread like any write. Falling back is safe: an
        inline try that failed stored nothing (its BEGIN IMMEDIATE never took the lock, or the
        transaction rolled back), so the second try is the first.

        On PostgreSQL only a job that waits for a worker is published: idle workers on other nodes
        look for it at once. A job stored claimed by this node, or waiting for its first answer, is
        news to no one: nobody can wait for a job before its start commits (its handle is minted
        after), and every waiter reads the job before it waits. So that start sends no notice, and
        no node's listener wakes for it.
        """
        done = self.insert_now(job, **options)
        return done if done is not None else await self.insert_off_loop(job, queued=queued, **options)

    async def insert_off_loop(
        self, job: JobRecord, *, queued: bool, **options: Any
    ) -> tuple[JobRecord, bool]:
        """`insert` on a worker thread, with no try on the event loop: for a start whose try there
        (`insert_now`) found a writer at work, so that each start offers its insert to the loop once."""
        return await self._write(
            job.id, queued, functools.partial(self.repo.insert, job, **options), publish=queued
        )

    def insert_now(self, job: JobRecord, **options: Any) -> tuple[JobRecord, bool] | None:
        """`insert`'s inline try alone, with no await: the stored job and whether it was created, when the
        insert ran here on the event loop (an SQLite file whose writer lock was free); None when nothing
        was written and the insert needs `insert_off_loop` (a writer is at work, or the store is not an SQLite
        file). A start that tries this first has no task to make and no turn of the loop to wait for."""
        done = self._write_now(job.id, functools.partial(self.repo.insert, job, **options))
        return None if done is None else done[0]

    async def write_short(self, job_id: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Like `write`, for a short write that SQLite runs on its own connection (`JobRepository.transition`,
        as a job's outcome): on an SQLite file it runs on the event loop when the writer lock is free,
        as a start's insert does (see `insert`), and on a worker thread otherwise."""
        call = functools.partial(fn, *args, **kwargs)
        done = self._write_now(job_id, call)
        return done[0] if done is not None else await self._write(job_id, False, call)

    def _write_now(self, job_id: str, call: Callable[[], T]) -> tuple[T] | None:
        """Run the short write `call` here on the event loop, if it can have the writer lock without waiting
        (SQLite files only), and wake `job_id`'s waiters: its result, in a 1-tuple. None when nothing was
        written: then `_write` makes the first try on a worker thread (and wakes the waiters itself)."""
        if not self.repo.writes_inline:
            return None
        try:
            result = self.repo.write_inline(call)
        except (WriterBusy, OperationalError):
            return None
        self.notifier.notify(job_id)
        return (result,)

    async def _write(self, job_id: str, queued: bool, call: Callable[[], T], *, publish: bool = True) -> T:
        try:
            if publish and self._publishes:
                return await self._run(
                    functools.partial(self.repo.publishing, job_id, self.origin, queued, call)
                )
            return await self._run(call)
        finally:
            self.notifier.notify(job_id)

    async def announce(self, job_id: str, *, queued: bool = False) -> None:
        """`job_id` changed: wake its waiters in this process, and on PostgreSQL in every other one.

        `queued` says it now waits for a worker, so idle workers elsewhere look for it at once.
        """
        self.notifier.notify(job_id)
        if self._publishes:
            with contextlib.suppress(StoreUnavailable):
                await self._run(functools.partial(self.repo.publish, job_id, self.origin, queued=queued))

    async def poll_watched(self) -> None:
        """Wake the waiters of every job changed by another process since they read it.

        One read of the watched jobs' versions for the whole process, instead of a re-read per
        waiter: a thousand long-polls cost one query per poll interval, not a thousand.
        """
        watched = self.notifier.watched()
        if not watched:
            return
        versions = await self.call(self.repo.versions, list(watched))
        for job_id, seen in watched.items():
            if versions.get(job_id) != seen:  # changed, or gone
                self.notifier.notify(job_id)

    async def _run(self, call: Callable[[], T], *, repeatable: bool = False) -> T:
        """Run `call` on a worker thread. A `repeatable` call (a read) that met a connection the server
        had dropped (a restart, a failover, an idle timeout) runs once more: the pool is invalidated by
        then, so the second try gets a fresh connection."""
        try:
            return await anyio.to_thread.run_sync(call, limiter=self._limiter)
        except (OperationalError, DBAPIError) as exc:
            if repeatable and exc.connection_invalidated:
                return await self._run(call)
            if (
                isinstance(exc, DBAPIError)
                and not isinstance(exc, OperationalError)
                and not exc.connection_invalidated
            ):
                raise
            logger.warning("database unavailable: %s", exc.__class__.__name__)
            raise StoreUnavailable.now() from exc
