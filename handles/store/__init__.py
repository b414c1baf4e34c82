"""The store: the repository behind an async facade that keeps the event loop free.

`Store.call` and `Store.write` run repository methods on worker threads; `write`
also wakes every local waiter of the job it changed (long-polls, `ask`). Waiters
in other processes notice within `store_poll_seconds`: each process reads the
versions of all the jobs it waits on once per interval (`Store.poll_watched`).
On an SQLite file the reads by key (`read`), a start's insert (`insert`) and a job's outcome
(`write_short`) run on the event loop itself: the insert and the outcome wait there for a writer of
this process, and go to a worker thread only while another process holds SQLite's lock.
A write of what a running job knows (`write_short`, `write_report`) waits out a database outage while its
lease may still be this node's (`Store.writable_until`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

import anyio
import anyio.to_thread
from sqlalchemy.exc import DBAPIError, OperationalError

from handles.backoff import backoff_seconds
from handles.errors import StoreUnavailable
from handles.store.engine import WriterBusy
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
    "StepRecord",
    "StepState",
    "Store",
    "SwitchRecord",
    "run_shielded",
    "utc_now",
]

logger = logging.getLogger("handles.store")

P = ParamSpec("P")
T = TypeVar("T")


def _wake(loop: asyncio.AbstractEventLoop, free: asyncio.Future[None]) -> None:
    """From whichever thread released the writer lock: resolve `free` on its event loop."""
    with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
        loop.call_soon_threadsafe(_resolve, free)


def _resolve(free: asyncio.Future[None]) -> None:
    if not free.done():
        free.set_result(None)


async def run_shielded(work: Coroutine[Any, Any, T]) -> T:
    """Await `work` in a task of its own that no cancellation of the caller stops: the caller is cancelled at
    once, and `work` goes on to its end (a write once offered is made, as one handed to a worker thread is)."""
    task = asyncio.ensure_future(work)
    task.add_done_callback(_retrieve)
    return await asyncio.shield(task)


def _raise_if_unavailable(exc: DBAPIError) -> None:
    """Raise `StoreUnavailable` (and log it) for a database error the database could not serve (it is down,
    it dropped the connection); return for one about the statement, which the caller raises as it is."""
    if isinstance(exc, OperationalError) or exc.connection_invalidated:
        logger.warning("database unavailable: %s", exc.__class__.__name__)
        raise StoreUnavailable.now() from exc


def _no_lease(job_id: str) -> float | None:
    """`Store.writable_until` of a store no runtime holds leases through: no lease on any job."""
    return None


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a shielded task's outcome as seen (its caller may have gone; the outcome is in the store)."""
    if not task.cancelled():
        task.exception()


class ChangeNotifier:
    """Wakes coroutines of this process that wait for a job to change.

    A waiter watches every change of a job, or only those past its reports (`watch(past_reports=True)`): a
    fetch, which waits for the job's status to move, sleeps on through the progress reports and durable
    steps of a running job, which wake a progress long-poll.
    """

    def __init__(self) -> None:
        # Weak: an event lives only while a waiter holds it. A job that ends is never notified
        # again, so a plain dict would keep one event per job ever waited on.
        self._events: weakref.WeakValueDictionary[str, asyncio.Event] = weakref.WeakValueDictionary()
        self._past_reports: weakref.WeakValueDictionary[str, asyncio.Event] = weakref.WeakValueDictionary()
        self._seen: dict[str, int] = {}  # job id -> the oldest version its current waiters have read

    def notify(self, job_id: str, change: Change = "changed") -> None:
        """`job_id` changed: wake its waiters. A `reported` change (only what it reports on its way: a progress
        report, a durable step's start or outcome) leaves the waiters past reports asleep. The version they
        read stays recorded, so `Store.poll_watched` still wakes them, at most once an interval."""
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
        """The event the next change of `job_id` sets (with `past_reports`, the next that is not only a
        report: see `notify`). Take it *before* reading the job, so that a change committed between the
        read and the wait is not missed."""
        events = self._past_reports if past_reports else self._events
        event = events.get(job_id)
        if event is None:
            event = events[job_id] = asyncio.Event()
        return event

    async def wait(self, job_id: str, timeout: float, *, event: asyncio.Event | None = None) -> None:
        """Return when `job_id` changes here (or `event`, from `watch`, is set), or after `timeout` seconds."""
        event = event if event is not None else self.watch(job_id)
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation that lands
        # just as the event is set, and the cancelled waiter would carry on.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(timeout, 0.0)):
                await event.wait()


def _set(event: asyncio.Event | None) -> None:
    if event is not None:
        event.set()


class Store:
    """Async access to a `JobRepository`; database faults become `StoreUnavailable`."""

    def __init__(self, repository: JobRepository, *, threads: int = 8) -> None:
        self.repo = repository
        self.notifier = ChangeNotifier()
        self.origin = "unnamed"  # the runtime names it; other nodes ignore their own publications
        self._publishes = repository.publishes
        self._limiter = anyio.CapacityLimiter(threads)
        # The loop time until which a write of what this node's run of a job knows waits out an outage (None:
        # this node holds no lease on it); the runtime that holds the leases sets it (`LeaseKeeper`).
        self.writable_until: Callable[[str], float | None] = _no_lease

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

        On PostgreSQL the change notice goes out once the method's write has committed, with the other
        notices of this node pending then (`JobRepository.publishing`).
        """
        return await self._write(job_id, "changed", functools.partial(fn, *args, **kwargs))

    async def write_queued(self, job_id: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Like `write`, for a change that leaves `job_id` waiting for a worker: idle workers on other
        nodes look for it at once."""
        return await self._write(job_id, "queued", functools.partial(fn, *args, **kwargs))

    async def insert(self, job: JobRecord, *, queued: bool, **options: Any) -> tuple[JobRecord, bool]:
        """Store a new job (`JobRepository.insert` with `options`), as `write` (`write_queued` when it
        waits for a worker) would.

        On an SQLite file the short insert transaction runs here, on the event loop, when the writer
        lock is free in this process and in SQLite (no waiting for either): no hop to a worker thread.
        When a writer of this process is at work, the insert waits for it on the event loop and then
        runs there (`insert_later`); when another process writes, it runs on a worker thread. Trying
        again is safe: an inline try that failed stored nothing (its BEGIN IMMEDIATE never took the
        lock, or the transaction rolled back), so the next try is the first.

        On PostgreSQL only a job that waits for a worker is published: idle workers on other nodes
        look for it at once. A job stored claimed by this node, or waiting for its first answer, is
        news to no one: nobody can wait for a job before its start commits (its handle is minted
        after), and every waiter reads the job before it waits. So that start sends no notice, and
        no node's listener wakes for it.
        """
        done = self.insert_now(job, **options)
        return done if done is not None else await self.insert_later(job, queued=queued, **options)

    async def insert_later(self, job: JobRecord, *, queued: bool, **options: Any) -> tuple[JobRecord, bool]:
        """`insert` once its try on the event loop (`insert_now`) found a writer at work, or on a store that
        is not an SQLite file: see `_write_later`."""
        change: Change = "queued" if queued else "changed"
        if self.repo.starts_on_loop:
            return await self._start_on_loop(job, change, queued, options)
        call = functools.partial(self.repo.insert, job, **options)
        return await self._write_later(job.id, call, change, publish=queued)

    async def _start_on_loop(
        self, job: JobRecord, change: Change, publish: bool, options: dict[str, Any]
    ) -> tuple[JobRecord, bool]:
        """`insert` on PostgreSQL awaited on the event loop (`JobRepository.start_on_loop`), publishing as
        `_write` does: the notice queued once the start has stored the job, and this process's waiters woken."""
        notice = self.repo.notice(job.id, self.origin, change) if publish and self._publishes else None
        try:
            return await self.repo.start_on_loop(job, notice=notice, **options)
        except (OperationalError, DBAPIError) as exc:
            _raise_if_unavailable(exc)
            raise
        finally:
            self.notifier.notify(job.id, change)

    def insert_now(self, job: JobRecord, **options: Any) -> tuple[JobRecord, bool] | None:
        """`insert`'s inline try alone, with no await: the stored job and whether it was created, when the
        insert ran here on the event loop (an SQLite file whose writer lock was free); None when nothing
        was written and the insert needs `insert_later` (a writer is at work, or the store is not an
        SQLite file). A start that tries this first has no task to make and no turn of the loop to wait
        for."""
        done = self._write_now(job.id, functools.partial(self.repo.insert, job, **options), "changed")
        return None if done is None else done[0]

    async def write_short(self, job_id: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Like `write`, for a short write that SQLite runs on its own connection (`JobRepository.transition`,
        as a job's outcome): on an SQLite file it runs on the event loop, at once when the writer lock is
        free, else once this process's writer is done (`_write_later`), as a start's insert does.

        It is what a run of this node knows (the job's outcome): one that meets a database outage is tried
        again, with backoff, while the job's lease may still be this node's (`_outlasting_outages`). So the
        write must be guarded: a try after the lease was lost, or after a try whose commit succeeded but
        whose answer was lost, must change nothing (a compare-and-set on the job's status and lease owner)."""
        return await self._write_short(job_id, "changed", functools.partial(fn, *args, **kwargs))

    async def write_report(self, job_id: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Like `write_short`, for a write of what a running job reports on its way (a progress report, a
        durable step's start or outcome), which leaves its status, lease, questions and result as they
        are: it wakes the waiters of every change of the job, here and on other nodes (a progress
        long-poll), and not those that wait past its reports (a fetch, which waits for its status to move:
        `ChangeNotifier`). A job of many steps so costs a waiting fetch no read per step.

        Like `write_short`, it waits out a database outage while the job's lease may still be this node's,
        so the write must be guarded (a step's outcome is written only while the step is still started)."""
        return await self._write_short(job_id, "reported", functools.partial(fn, *args, **kwargs))

    async def _write_short(self, job_id: str, change: Change, call: Callable[[], T]) -> T:
        done = self._write_now(job_id, call, change)
        if done is not None:
            return done[0]
        return await self._outlasting_outages(
            job_id, functools.partial(self._write_later, job_id, call, change)
        )

    async def _outlasting_outages(self, job_id: str, write: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """`write()`, tried again with backoff while the database is unavailable, until `writable_until` says
        the lease on `job_id` is likely lost (another node's sweep then settles the job); then, or at once
        for a job this node holds no lease on, `StoreUnavailable`."""
        loop = asyncio.get_running_loop()
        failures = 0
        while True:
            try:
                return await write()
            except StoreUnavailable:
                failures += 1
                kept = self.writable_until(job_id)
                left = None if kept is None else kept - loop.time()
                if left is None or left <= 0:
                    raise
                logger.info("job %s: a write met a database outage; trying again", job_id)
                await asyncio.sleep(min(left, backoff_seconds(failures, first=0.2, most=2.0)))

    def _write_now(self, job_id: str, call: Callable[[], T], change: Change) -> tuple[T] | None:
        """Run the short write `call` here on the event loop, if it can have the writer lock without waiting
        (SQLite files only), and wake `job_id`'s waiters: its result, in a 1-tuple. None when nothing was
        written (`_write_later` then writes it)."""
        if not self.repo.writes_inline:
            return None
        with contextlib.suppress(WriterBusy, OperationalError):
            return self._write_here(job_id, call, change)
        return None

    def _write_here(self, job_id: str, call: Callable[[], T], change: Change) -> tuple[T]:
        """`_write_now`'s try, which raises `WriterBusy` (this process's writer is at work) or
        `OperationalError` (another process holds SQLite's lock) when nothing was written. A write that
        raises anything else may have committed first (a step's outcome kept before `LeaseLost`), so its
        waiters are woken then too, as `_write` wakes them whatever its call did."""
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
        """A short write whose try on the event loop found a writer at work, or on a store that is not an
        SQLite file (there: `_write` on a worker thread).

        On an SQLite file it waits on the event loop for this process's writer lock and writes there
        once the lock is free (`_write_when_free`). It does not queue on a worker thread for the lock: the
        thread's hop would hold the lock longer, and every write meeting it would go to a thread in turn
        (after each checkpoint, a stream of concurrent starts stayed on threads until it thinned out).
        It runs in a task of its own, shielded: once offered, the write is made even if the caller is
        cancelled meanwhile, as a write handed to a worker thread is.
        """
        if not self.repo.writes_inline:
            return await self._write(job_id, change, call, publish=publish)
        return await run_shielded(self._write_when_free(job_id, call, change, publish))

    async def _write_when_free(self, job_id: str, call: Callable[[], T], change: Change, publish: bool) -> T:
        """Write on the event loop once this process's writer lock is free; on a worker thread (`_write`,
        whose connection waits for SQLite's lock) when another process writes."""
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

    async def _write(self, job_id: str, change: Change, call: Callable[[], T], *, publish: bool = True) -> T:
        try:
            if publish and self._publishes:
                return await self._run(
                    functools.partial(self.repo.publishing, job_id, self.origin, change, call)
                )
            return await self._run(call)
        finally:
            self.notifier.notify(job_id, change)

    async def announce(self, job_id: str, *, queued: bool = False) -> None:
        """`job_id` changed: wake its waiters in this process, and on PostgreSQL in every other one.

        `queued` says it now waits for a worker, so idle workers elsewhere look for it at once.
        """
        self.notifier.notify(job_id)
        self.repo.publish(job_id, self.origin, queued=queued)  # queued, sent by a thread of its own

    async def change_listener(
        self, on_change: Callable[[str, Change], None]
    ) -> Coroutine[Any, Any, None] | None:
        """What hears other nodes' changes to run beside the runtime (PostgreSQL's `LISTEN`), calling
        `on_change(job_id, change)` for each; None where the store has no notices (an SQLite file, shared by
        the processes of one machine, is watched by `poll_watched` alone)."""
        if not self._publishes:
            return None
        from handles.store.listen import ChangeListener

        try:  # this node's notices name its schema, for deployments that share the database
            await self.call(self.repo.load_notice_scope)
        except Exception as exc:  # they name none: every listener of the database takes them, as before
            logger.warning("could not read the store's schema for its change notices: %s", exc)
        return ChangeListener(self.repo.url, self.origin, on_change).run()

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
            _raise_if_unavailable(exc)
            raise
