"""A start on an SQLite file is written on the event loop when the writer lock is free (no worker-thread
hop, issue 14); when a writer of this process is at work it waits for it on the loop and is written there,
and when another process writes it goes to a worker thread. The limit and the idempotency key mean the
same either way, and the job is committed before the start returns."""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from handles.store import JobRepository, Store
from handles.store.engine import Database, WriterLock
from handles.store.repository import ActiveLimitReached
from tests.runtime.support import job_row, quick_jobs, start_in, sweeps_done
from tests.store.sqlite_support import (
    another_process_writing,
    statement_threads,
    this_process_writing,
    ticks_while_pending,
)


def _insert_threads(repo: JobRepository) -> list[int]:
    """The threads that run each INSERT into handles_jobs."""
    return statement_threads(repo, "INSERT INTO handles_jobs")


@pytest.fixture
def inserts(sqlite_repo: JobRepository) -> list[int]:
    """The threads that run each INSERT into handles_jobs on `sqlite_repo`, in order."""
    return _insert_threads(sqlite_repo)


def _committed(path: Path, job_id: str) -> bool:
    """Read by a connection of its own: the row is on disk, committed."""
    connection = sqlite3.connect(path)
    try:
        return (
            connection.execute("select count(*) from handles_jobs where id = ?", (job_id,)).fetchone()[0] == 1
        )
    finally:
        connection.close()


def test_a_start_is_written_on_the_event_loop_and_committed_before_it_returns(
    sqlite_repo: JobRepository, sqlite_path: Path, inserts: list[int]
) -> None:
    async def main() -> None:
        store = Store.of(sqlite_repo)
        job = job_row(f"i-{secrets.token_hex(4)}")
        stored, created = await start_in(store, job, queued=False, active_limit=5)
        assert created and stored.id == job.id
        assert _committed(sqlite_path, job.id)
        assert inserts == [threading.get_ident()], "written on the event loop's thread"

    asyncio.run(main())


def test_the_limit_and_the_idempotency_key_hold_on_the_event_loop(sqlite_repo: JobRepository) -> None:
    async def main() -> None:
        store = Store.of(sqlite_repo)
        first = job_row(f"i-{secrets.token_hex(4)}", idempotency_key="k")
        assert (await start_in(store, first, queued=False, active_limit=1))[1]
        again, created = await start_in(
            store, job_row(f"i-{secrets.token_hex(4)}", idempotency_key="k"), queued=False, active_limit=1
        )
        assert not created and again.id == first.id
        refused = job_row(f"i-{secrets.token_hex(4)}")
        with pytest.raises(ActiveLimitReached):
            await start_in(store, refused, queued=False, active_limit=1)
        assert sqlite_repo.get(refused.id) is None

    asyncio.run(main())


def test_a_start_goes_to_a_worker_thread_while_another_process_writes_and_the_loop_stays_free(
    sqlite_repo: JobRepository, sqlite_path: Path, inserts: list[int]
) -> None:
    async def main() -> None:
        store = Store.of(sqlite_repo)
        job = job_row(f"i-{secrets.token_hex(4)}")
        with another_process_writing(sqlite_path) as other:
            start = asyncio.create_task(start_in(store, job, queued=False, active_limit=5))
            ticks = await ticks_while_pending(start)  # the loop keeps serving while the start waits
            other.execute("COMMIT")
        _, created = await asyncio.wait_for(start, 10)
        assert created and _committed(sqlite_path, job.id)
        assert ticks >= 10
        assert inserts and inserts[-1] != threading.get_ident(), "written on a worker thread"

    asyncio.run(main())


def test_a_start_waits_on_the_event_loop_while_this_process_writes_and_is_written_there(
    sqlite_repo: JobRepository, sqlite_path: Path, inserts: list[int]
) -> None:
    """A writer of this process (a sweep, a heartbeat, a checkpoint) holds the lock: the start waits for it on
    the event loop, which keeps serving meanwhile, and inserts there once it is free, not on a worker thread."""

    async def main() -> None:
        store = Store.of(sqlite_repo)
        with this_process_writing(sqlite_repo) as release:
            job = job_row(f"i-{secrets.token_hex(4)}")
            start = asyncio.create_task(start_in(store, job, queued=False))
            ticks = await ticks_while_pending(start)  # the loop keeps serving while the start waits
            release.set()
            assert (await asyncio.wait_for(start, 10))[1]
        assert ticks >= 10
        assert _committed(sqlite_path, job.id)
        assert inserts == [threading.get_ident()], (
            "written on the event loop's thread once the writer was done"
        )

    asyncio.run(main())


def test_a_start_cancelled_while_it_waits_for_this_processs_writer_is_still_written(
    sqlite_repo: JobRepository, sqlite_path: Path
) -> None:
    """Once offered, the insert is made, as one handed to a worker thread is: the caller's cancellation does
    not take it back (a start's caller may go away; its job is committed all the same, see `JobOperations`)."""

    async def main() -> None:
        store = Store.of(sqlite_repo)
        job = job_row(f"i-{secrets.token_hex(4)}")
        with this_process_writing(sqlite_repo) as release:
            start = asyncio.create_task(start_in(store, job, queued=False))
            await asyncio.sleep(0.1)
            start.cancel()
            with pytest.raises(asyncio.CancelledError):
                await start
            assert not _committed(sqlite_path, job.id), "nothing is written while the writer is at work"
            release.set()
            for _ in range(200):
                if _committed(sqlite_path, job.id):
                    break
                await asyncio.sleep(0.01)
        assert _committed(sqlite_path, job.id)

    asyncio.run(main())


def test_sqlite_refuses_a_database_lease_clock_and_says_what_to_use(sqlite_path: Path) -> None:
    """SQLite runs in this process: it has no clock of its own to judge leases by, so asking for one is a
    mistake said at once, not a second start sqlite_path that quietly behaves like the first."""
    with pytest.raises(ValueError, match=r"PostgreSQL.*use 'local'"):
        JobRepository(f"sqlite:///{sqlite_path.as_posix()}", lease_clock="database")
    repository = JobRepository(f"sqlite:///{sqlite_path.as_posix()}", lease_clock="local")
    try:
        assert not repository.database_leases
    finally:
        repository.dispose()


def test_a_start_with_the_writer_free_makes_no_task_but_its_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`JobOperations.start` on an SQLite file whose writer is free runs the insert right where it is (no
    await: nothing can cancel it half-way), so the only task a start makes is the job's own run. A start
    whose insert must wait for the writer makes one more, shielded (tests/runtime/test_slots.py).

    A start that found the writer at work after all (a background write of the node on a worker thread, on
    a loaded machine) got a coroutine from `Store.start`: it does not meet this test's condition, and the
    test starts again, up to 20 times."""
    swept = sweeps_done(monkeypatch)
    waited: list[str] = []
    start = Store.start

    def counted_start(self: Store, job: Any, **options: Any) -> Any:
        done = start(self, job, **options)
        if not isinstance(done, tuple):  # its insert waits for the writer
            waited.append(job.id)
        return done

    monkeypatch.setattr(Store, "start", counted_start)

    async def main() -> None:
        jobs, _ = quick_jobs(tmp_path, lease_seconds=120, heartbeat_seconds=60)  # no heartbeat comes due
        await jobs.start()
        loop = asyncio.get_running_loop()
        made: list[asyncio.Task[Any]] = []

        def counting(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
            task = asyncio.Task(coro, loop=loop, **kwargs)
            made.append(task)  # named by `create_task` once made
            return task

        try:
            await asyncio.wait_for(swept.wait(), 10)  # the node's first sweep writes on a worker thread
            await jobs.service.start(jobs.specs["quick"], "alice", {}, None)  # warm: the schema, the switches
            for _ in range(20):
                made.clear()
                waited.clear()
                loop.set_task_factory(counting)
                started = await jobs.service.start(jobs.specs["quick"], "alice", {}, None)
                loop.set_task_factory(None)
                assert started.created
                if not waited:  # the writer was free: the start's insert ran where it was
                    assert [task.get_name() for task in made] == ["handles-job-quick"]
                    break
                await asyncio.sleep(0.05)
            assert not waited, "every start found the writer at work"
        finally:
            loop.set_task_factory(None)
            await jobs.aclose()

    asyncio.run(main())


def test_a_start_that_meets_this_processs_writer_inserts_on_the_loop_once_it_is_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its try on the event loop finds the writer taken, so the insert waits for it on the loop
    (the coroutine `Store.start` returns) and is tried there again once the writer is done: it never goes to a worker
    thread, and the start returns its job, created."""
    swept = sweeps_done(monkeypatch)

    async def main() -> None:
        jobs, _ = quick_jobs(tmp_path, lease_seconds=120, heartbeat_seconds=60)
        await jobs.start()
        repo = jobs.service.store.repo
        offered: list[str] = []
        write_inline = repo.write_inline

        def spied(fn: Any, *args: Any, **kwargs: Any) -> Any:
            offered.append(getattr(fn, "func", fn).__name__)
            return write_inline(fn, *args, **kwargs)

        try:
            await asyncio.wait_for(swept.wait(), 10)
            threads = _insert_threads(repo)
            monkeypatch.setattr(repo, "write_inline", spied)
            with this_process_writing(repo) as release:
                start = asyncio.create_task(jobs.service.start(jobs.specs["quick"], "alice", {}, None))
                await asyncio.sleep(0.2)
                assert not start.done(), "the insert did not wait for the writer"
                assert offered == ["insert"], offered
                release.set()
                started = await asyncio.wait_for(start, 10)
            assert started.created
            assert offered[:2] == ["insert", "insert"], offered
            assert threads and set(threads) == {threading.get_ident()}, "inserted on the event loop's thread"
        finally:
            await jobs.aclose()

    asyncio.run(main())


def test_the_writer_lock_wakes_every_event_loop_waiter_while_threads_take_it_in_turn() -> None:
    """No lost wake-up: a waiter that found the lock taken is woken by the release that follows, however the
    release and its registration interleave (four threads take the lock 2,000 times meanwhile)."""
    lock = WriterLock()
    stop = threading.Event()

    def taker() -> None:
        while not stop.is_set():
            with lock:
                pass

    async def main() -> None:
        loop = asyncio.get_running_loop()
        waited = 0
        for _ in range(2000):
            free: asyncio.Future[None] = loop.create_future()

            def wake(free: asyncio.Future[None] = free) -> None:
                loop.call_soon_threadsafe(lambda: free.done() or free.set_result(None))

            if lock.wake_when_free(wake):
                waited += 1
                await asyncio.wait_for(free, 5)  # a lost wake-up times out here
        assert waited > 0, "the threads never held the lock when asked: the test proved nothing"

    threads = [threading.Thread(target=taker) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        asyncio.run(main())
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)


def test_concurrent_starts_through_checkpoints_all_insert_on_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight starts at a time, 400 in all: every hundred commits a checkpoint holds this process's writer on a
    thread of its own, and the starts that meet it wait for it on the loop. None goes to a worker thread
    (where it would hold the writer a thread hop longer, and the next start that met it would follow)."""
    swept = sweeps_done(monkeypatch)
    checkpoints: list[int] = []
    checkpoint = Database.checkpoint

    def counted(self: Database) -> None:
        checkpoints.append(threading.get_ident())
        checkpoint(self)

    monkeypatch.setattr(Database, "checkpoint", counted)

    async def main() -> None:
        jobs, _ = quick_jobs(tmp_path, lease_seconds=120, heartbeat_seconds=60)
        await jobs.start()
        try:
            await asyncio.wait_for(swept.wait(), 10)
            threads = _insert_threads(jobs.service.store.repo)
            for wave in range(50):
                await asyncio.gather(
                    *(jobs.service.start(jobs.specs["quick"], f"p{wave}-{n}", {}, None) for n in range(8))
                )
        finally:
            await jobs.aclose()  # each start returned once its insert committed; the jobs are drained here
        assert len(checkpoints) >= 3, "no checkpoint held the writer: the test proved nothing"
        assert len(threads) == 400 and set(threads) == {threading.get_ident()}, (
            "an insert ran on a worker thread"
        )

    asyncio.run(main())
