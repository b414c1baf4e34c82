"""A job's outcome on an SQLite file is written on the event loop when the writer lock is free (no
worker-thread hop, issue 14, change 27), as a start's insert is; on the loop too once a writer of this
process is done (change 34), and on a worker thread while another process writes. Either way it is
committed before the write returns, its waiters wake, and a run that no longer holds its job writes
nothing."""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from handles import Handles, JobContext
from handles.states import Status
from handles.store import JobRepository, Store, utc_now
from tests.durability.harness import config
from tests.runtime.support import job_row, settled, start_as
from tests.store.sqlite_support import (
    another_process_writing,
    statement_threads,
    this_process_writing,
    ticks_while_pending,
)

UPDATE = "UPDATE handles_jobs"


@pytest.fixture
def updates(sqlite_repo: JobRepository) -> list[int]:
    """The threads that run each UPDATE of handles_jobs on `sqlite_repo`, in order."""
    return statement_threads(sqlite_repo, UPDATE)


def _status(path: Path, job_id: str) -> str:
    """Read by a connection of its own: what is on disk, committed."""
    connection = sqlite3.connect(path)
    try:
        return str(
            connection.execute("select status from handles_jobs where id = ?", (job_id,)).fetchone()[0]
        )
    finally:
        connection.close()


def _held_job(repo: JobRepository, owner: str) -> str:
    job = job_row(
        f"o-{secrets.token_hex(4)}", lease_owner=owner, lease_expires_at=utc_now() + timedelta(hours=1)
    )
    repo.insert(job)
    return job.id


def _outcome(store: Store, job_id: str, owner: str) -> asyncio.Task[bool]:
    return asyncio.ensure_future(
        store.write(
            job_id,
            "outcome",
            store.repo.transition,
            job_id,
            Status.COMPLETED,
            owner=owner,
            result={"content": []},
        )
    )


def test_an_outcome_is_written_on_the_event_loop_committed_and_its_waiters_woken(
    sqlite_repo: JobRepository, sqlite_path: Path, updates: list[int]
) -> None:
    job_id = _held_job(sqlite_repo, "me")

    async def main() -> None:
        store = Store.of(sqlite_repo)
        changed = store.notifier.watch(job_id)
        assert await _outcome(store, job_id, "me")
        assert changed.is_set()
        assert _status(sqlite_path, job_id) == "completed"
        assert updates == [threading.get_ident()], "written on the event loop's thread"

    asyncio.run(main())


def test_an_outcome_of_a_job_held_by_another_runtime_writes_nothing(
    sqlite_repo: JobRepository, sqlite_path: Path, updates: list[int]
) -> None:
    job_id = _held_job(sqlite_repo, "someone-else")

    async def main() -> None:
        store = Store.of(sqlite_repo)
        assert not await _outcome(store, job_id, "me")
        assert _status(sqlite_path, job_id) == "working"
        assert updates == []

    asyncio.run(main())


def test_an_outcome_goes_to_a_worker_thread_while_another_process_writes_and_the_loop_stays_free(
    sqlite_repo: JobRepository, sqlite_path: Path, updates: list[int]
) -> None:
    job_id = _held_job(sqlite_repo, "me")

    async def main() -> None:
        store = Store.of(sqlite_repo)
        with another_process_writing(sqlite_path) as other:
            outcome = _outcome(store, job_id, "me")
            ticks = await ticks_while_pending(outcome)  # the loop keeps serving while the outcome waits
            other.execute("COMMIT")
        assert await asyncio.wait_for(outcome, 10)
        assert _status(sqlite_path, job_id) == "completed"
        assert ticks >= 10
        assert updates and updates[-1] != threading.get_ident(), "written on a worker thread"

    asyncio.run(main())


def test_an_outcome_waits_on_the_event_loop_while_this_process_writes_and_is_written_there(
    sqlite_repo: JobRepository, sqlite_path: Path, updates: list[int]
) -> None:
    """A writer of this process holds the lock (a sweep, a heartbeat, a checkpoint): the outcome waits for it on
    the event loop, which keeps serving, and is written there once it is free, its waiters woken."""
    job_id = _held_job(sqlite_repo, "me")

    async def main() -> None:
        store = Store.of(sqlite_repo)
        changed = store.notifier.watch(job_id)
        with this_process_writing(sqlite_repo) as release:
            outcome = _outcome(store, job_id, "me")
            ticks = await ticks_while_pending(outcome)
            assert not changed.is_set()
            release.set()
            assert await asyncio.wait_for(outcome, 10)
        assert changed.is_set()
        assert ticks >= 10
        assert _status(sqlite_path, job_id) == "completed"
        assert updates == [threading.get_ident()], (
            "written on the event loop's thread once the writer was done"
        )

    asyncio.run(main())


def test_a_runtime_offers_a_jobs_outcome_to_the_event_loop_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime writes a run's outcome through `Store.write` (`outcome`): tried on the event loop first.
    Whether the first try succeeds depends on the writer lock (a sweep at startup, a heartbeat may hold it
    for a moment: then the write waits for it and is tried on the loop again, as the tests above show), so
    what is checked here is the order of the offers (the start's insert, then the outcome) and the outcome."""
    jobs = Handles(config(tmp_path))

    @jobs.job()
    async def quick(ctx: JobContext) -> str:
        return "done"

    offered: list[str] = []

    async def main() -> None:
        async with jobs.running():
            sqlite_repo = jobs.service.store.repo
            write_inline = sqlite_repo.write_inline

            def spied(fn: Any, *args: Any, **kwargs: Any) -> Any:
                offered.append(getattr(fn, "func", fn).__name__)
                return write_inline(fn, *args, **kwargs)

            monkeypatch.setattr(sqlite_repo, "write_inline", spied)
            handle = await start_as(jobs, "alice", "quick")
            record = await settled(jobs, handle)
            assert record.status == Status.COMPLETED.value
            inserts, outcomes = offered.count("insert"), offered.count("transition")
            assert inserts >= 1 and outcomes >= 1, offered
            assert offered == ["insert"] * inserts + ["transition"] * outcomes, offered

    asyncio.run(main())
