"""The store: the repository behind an async facade that keeps the event loop free and wakes the waiters of
the job a write changed, here at once and elsewhere by notice or poll."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, Literal

import anyio
import anyio.to_thread
from sqlalchemy.exc import DBAPIError, OperationalError

from handles.backoff import backoff_seconds
from handles.errors import StoreUnavailable
from handles.store.engine import P, T, WriterBusy
from handles.store.models import (
    Clock,
    InputRequestRecord,
    JobRecord,
    JobState,
    StepRecord,
    StepState,
    SwitchRecord,
    utc_now,
)
from handles.store.repository import AnswerOutcome, CancelOutcome, Change, JobRepository

__all__ = [
    "AnswerOutcome",
    "CancelOutcome",
    "Change",
    "ChangeNotifier",
    "Clock",
    "InputRequestRecord",
    "JobRecord",
    "JobRepository",
    "JobState",
    "Started",
    "StepRecord",
    "StepState",
    "Store",
    "SwitchRecord",
    "Write",
    "run_shielded",
    "utc_now",
]

logger = logging.getLogger("handles.store")

Write = Literal["changed", "queued", "outcome", "reported"]
"""What a write means: a change (`changed`), one that leaves the job waiting for a worker (`queued`), a job's
outcome this process knows (`outcome`), or a report that wakes only progress long-polls (`reported`)."""
Started = tuple[JobRecord, bool]


def _wake(loop: asyncio.AbstractEventLoop, free: asyncio.Future[None]) -> None:
    """From whichever thread released the writer lock: resolve `free` on its event loop."""
    with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
        loop.call_soon_threadsafe(_resolve, free)


def _resolve(free: asyncio.Future[None]) -> None:
    if not free.done():
        free.set_result(None)


async def run_shielded(work: Coroutine[Any, Any, T]) -> T:
    """Await `work` in a task no cancellation of the caller stops, so a write once offered is made."""
    task = asyncio.ensure_future(work)
    task.add_done_callback(_retrieve)
    return await asyncio.shield(task)


def _raise_if_unavailable(exc: DBAPIError) -> None:
    """Raise `StoreUnavailable` for an error the database could not serve (down, dropped)."""
    if isinstance(exc, OperationalError) or exc.connection_invalidated:
        logger.warning("database unavailable: %s", exc.__class__.__name__)
        raise StoreUnavailable.now() from exc


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a shielded task's outcome as seen (its caller may have gone; the outcome is in the store)."""
    if not task.cancelled():
        task.exception()


class ChangeNotifier:
    """Wakes this process's coroutines that wait for a job to change (or change past reports)."""

    def __init__(self) -> None:
        # Weak: an event lives only while a waiter holds it.
        self._events: weakref.WeakValueDictionary[str, asyncio.Event] = weakref.WeakValueDictionary()
        self._past_reports: weakref.WeakValueDictionary[str, asyncio.Event] = weakref.WeakValueDictionary()
        self._seen: dict[str, int] = {}  # job id -> the oldest version its current waiters have read

    def notify(self, job_id: str, change: Change = "changed") -> None:
        """`job_id` changed: wake its waiters (those past reports only for a non-`reported` change)."""
        if change != "reported":
            self._seen.pop(job_id, None)
            _set(self._past_reports.pop(job_id, None))
        _set(self._events.pop(job_id, None))

    def notify_all(self) -> None:
        """Wake every waiter of this process (the node is draining: long-polls answer now)."""
        events = [*self._events.values(), *self._past_reports.values()]
        self._events.clear()
        self._past_reports.clear()
        self._seen.clear()
        for event in events:
            event.set()

    def seen(self, job_id: str, version: int) -> None:
        """A waiter of `job_id` has read `version` and now waits for a newer one."""
        self._seen[job_id] = min(version, self._seen.get(job_id, version))

    def watched(self) -> dict[str, int]:
        """The jobs waited on now, each with the oldest version its waiters have read."""
        for job_id in [j for j in self._seen if j not in self._events and j not in self._past_reports]:
            del self._seen[job_id]  # its waiters are gone
        return dict(self._seen)

    def watch(self, job_id: str, *, past_reports: bool = False) -> asyncio.Event:
        """The event the next change of `job_id` sets; take it *before* reading the job."""
        events = self._past_reports if past_reports else self._events
        event = events.get(job_id)
        if event is None:
            event = events[job_id] = asyncio.Event()
        return event

    async def wait(self, job_id: str, timeout: float, *, event: asyncio.Event | None = None) -> None:
        """Return when `job_id` changes here (or `event`, from `watch`, is set), or after `timeout` seconds."""
        event = event if event is not None else self.watch(job_id)
        # asyncio.timeout, not wait_for: on 3.11 wait_for may swallow a cancellation.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(timeout, 0.0)):
                await event.wait()


def _set(event: asyncio.Event | None) -> None:
    if event is not None:
        event.set()


class Store:
    """Async access to a `JobRepository`, each call on a worker thread (PostgreSQL's starts awaited on the event
    loop's own connections); database faults become `StoreUnavailable`. `Store.of` gives an engine its own."""

    def __init__(self, repository: JobRepository, *, threads: int = 8) -> None:
        self.repo = repository
        self.notifier = ChangeNotifier()
        self.origin = "unnamed"  # the runtime names it; other nodes ignore their own publications
        self._publishes = repository.publishes
        self._limiter = anyio.CapacityLimiter(threads)
        # Loop time until which a write of what this node knows outlasts an outage (None: no lease).
        self.writable_until: Callable[[str], float | None] = lambda job_id: None

    @staticmethod
    def of(repository: JobRepository) -> Store:
        """The store of `repository`'s engine: an SQLite file's runs short calls on the event loop."""
        return SqliteStore(repository) if repository.sqlite else Store(repository)

    async def read(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a read-only repository method on a worker thread."""
        return await self._run(functools.partial(fn, *args, **kwargs), repeatable=True)

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a repository method that changes nothing anyone waits for (reads, sweeps)."""
        return await self._run(functools.partial(fn, *args, **kwargs))

    async def write(
        self, job_id: str, meaning: Write, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run a repository method that may change `job_id` and wake its waiters; `meaning` (see `Write`) says
        how. An `outcome` or `reported` write must be a compare-and-set: it is retried through an outage."""
        call = functools.partial(fn, *args, **kwargs)
        if meaning == "changed" or meaning == "queued":
            return await self._write(job_id, meaning, call)
        change: Change = "reported" if meaning == "reported" else "changed"
        done = self._write_now(job_id, call, change)
        if done is not None:
            return done[0]
        loop = asyncio.get_running_loop()
        failures = 0
        while True:
            try:
                return await self._write_later(job_id, call, change)
            except StoreUnavailable:
                failures += 1
                kept = self.writable_until(job_id)
                left = None if kept is None else kept - loop.time()
                if left is None or left <= 0:
                    raise
                logger.info("job %s: a write met a database outage; trying again", job_id)
                await asyncio.sleep(min(left, backoff_seconds(failures, first=0.2, most=2.0)))

    def start(
        self, job: JobRecord, *, queued: bool, **options: Any
    ) -> Started | Coroutine[Any, Any, Started]:
        """Store a new job: (job, created) when the insert ran at once on an SQLite file's free writer lock,
        else the coroutine that makes it; only a `queued` job is published."""
        done = self._write_now(job.id, functools.partial(self.repo.insert, job, **options), "changed")
        return done[0] if done is not None else self._start_later(job, queued, options)

    async def _start_later(self, job: JobRecord, queued: bool, options: dict[str, Any]) -> Started:
        change: Change = "queued" if queued else "changed"
        if not self.repo.starts_on_loop:
            call = functools.partial(self.repo.insert, job, **options)
            return await self._write_later(job.id, call, change, publish=queued)
        notice = self.repo.notice(job.id, self.origin, change) if queued and self._publishes else None
        try:
            return await self.repo.start_on_loop(job, notice=notice, **options)
        except (OperationalError, DBAPIError) as exc:
            _raise_if_unavailable(exc)
            raise
        finally:
            self.notifier.notify(job.id, change)

    def _write_now(self, job_id: str, call: Callable[[], T], change: Change) -> tuple[T] | None:
        """`call`'s result in a 1-tuple when it could be written at once, here; else None."""
        return None

    async def _write_later(
        self, job_id: str, call: Callable[[], T], change: Change, *, publish: bool = True
    ) -> T:
        """A short write `_write_now` did not make."""
        return await self._write(job_id, change, call, publish=publish)

    async def _write(self, job_id: str, change: Change, call: Callable[[], T], *, publish: bool = True) -> T:
        try:
            if publish and self._publishes:
                return await self._run(
                    functools.partial(self.repo.publishing, job_id, self.origin, change, call)
                )
            return await self._run(call)
        finally:
            self.notifier.notify(job_id, change)

    async def announce(self, job_id: str) -> None:
        """`job_id` waits for a worker again: wake its waiters here and, on PostgreSQL, on every other node."""
        self.notifier.notify(job_id)
        self.repo.publish(job_id, self.origin, queued=True)  # queued, sent by a thread of its own

    async def change_listener(
        self, on_change: Callable[[str, Change], None]
    ) -> Coroutine[Any, Any, None] | None:
        """The coroutine that hears other nodes' changes; None where the store has no notices."""
        if not self._publishes:
            return None
        from handles.store.listen import ChangeListener

        try:  # this node's notices name its schema, for deployments that share the database
            await self.call(self.repo.load_notice_scope)
        except Exception as exc:  # they name none: every listener of the database takes them
            logger.warning("could not read the store's schema for its change notices: %s", exc)
        return ChangeListener(self.repo.url, self.origin, on_change).run()

    async def poll_watched(self) -> None:
        """Wake the waiters of every watched job another process changed since they read it."""
        watched = self.notifier.watched()
        if not watched:
            return
        versions = await self.call(self.repo.versions, list(watched))
        for job_id, seen in watched.items():
            if versions.get(job_id) != seen:  # changed, or gone
                self.notifier.notify(job_id)

    async def _run(self, call: Callable[[], T], *, repeatable: bool = False) -> T:
        """Run `call` on a worker thread; a `repeatable` one that met a dropped connection runs again."""
        try:
            return await anyio.to_thread.run_sync(call, limiter=self._limiter)
        except (OperationalError, DBAPIError) as exc:
            if repeatable and exc.connection_invalidated:
                return await self._run(call)
            _raise_if_unavailable(exc)
            raise


class SqliteStore(Store):
    """The store of an SQLite file: reads and short writes run inline on the event loop while this process's
    writer lock is free, and wait for it, without a thread, when it is not."""

    async def read(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a read-only repository method inline when the file answers at once, else on a thread."""
        with contextlib.suppress(OperationalError):
            return self.repo.read_inline(fn, *args, **kwargs)
        return await super().read(fn, *args, **kwargs)

    def _write_now(self, job_id: str, call: Callable[[], T], change: Change) -> tuple[T] | None:
        """Try `call` inline on a free writer lock: its result in a 1-tuple, or None."""
        with contextlib.suppress(WriterBusy, OperationalError):
            return self._write_here(job_id, call, change)
        return None

    def _write_here(self, job_id: str, call: Callable[[], T], change: Change) -> tuple[T]:
        """`_write_now`'s try; an error other than a busy lock may follow a commit, so it wakes too."""
        try:
            result = self.repo.write_inline(call)
        except (WriterBusy, OperationalError):
            raise  # nothing was written
        except BaseException:
            self.notifier.notify(job_id, change)
            raise
        self.notifier.notify(job_id, change)
        return (result,)

    async def _write_later(
        self, job_id: str, call: Callable[[], T], change: Change, *, publish: bool = True
    ) -> T:
        """A short write whose inline try met a busy writer, made even if the caller is cancelled."""
        return await run_shielded(self._write_when_free(job_id, call, change, publish))

    async def _write_when_free(self, job_id: str, call: Callable[[], T], change: Change, publish: bool) -> T:
        """Write inline once this process's writer lock is free; on a thread if another process writes."""
        loop = asyncio.get_running_loop()
        while True:
            free: asyncio.Future[None] = loop.create_future()
            if self.repo.wake_when_writer_free(functools.partial(_wake, loop, free)):
                await free
            try:
                return self._write_here(job_id, call, change)[0]
            except WriterBusy:
                continue  # another writer of this process took the lock first: wait for it in turn
            except OperationalError:
                break
        return await self._write(job_id, change, call, publish=publish)
