"""An SQLite file's WAL is copied back into the database (a checkpoint) off the event loop.

A start's insert commits on the event loop (`Store.start`, the inline write). SQLite's automatic
checkpoint runs in whichever connection commits past 1,000 WAL pages, and it writes and syncs the
database file: on the inline connection that stalled the loop for several milliseconds about once every
hundred starts. The inline connection never checkpoints; every `INLINE_COMMITS_PER_CHECKPOINT` inline
commits a passive checkpoint runs on a thread of its own, and every other writer (worker threads) keeps
SQLite's automatic checkpoint.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from handles.handle import new_job_id
from handles.store import JobRepository, Store
from handles.store.engine import INLINE_COMMITS_PER_CHECKPOINT
from tests.harness.postgres import repository
from tests.runtime.support import job_row, start_in


@pytest.fixture
def repo(tmp_path: Path) -> Iterator[JobRepository]:
    with repository(f"sqlite:///{tmp_path / 'handles.db'}") as repo:
        yield repo


def _wal_frames(path: Path) -> int:
    """The frames in the WAL now (a passive checkpoint on a connection of its own reports them)."""
    connection = sqlite3.connect(path)
    try:
        _busy, frames, _copied = connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return int(frames)
    finally:
        connection.close()


async def _start_inline(store: Store, count: int) -> None:
    for _ in range(count):
        job = job_row(new_job_id())
        stored, created = await start_in(store, job, queued=False)
        assert created and stored.id == job.id


def test_the_event_loops_write_connection_never_checkpoints_and_the_others_do(repo: JobRepository) -> None:
    async def main() -> None:
        await _start_inline(Store.of(repo), 1)

    asyncio.run(main())
    inline = repo._inline_write_raw
    assert inline is not None, "the start wrote on the event loop's connection"
    assert inline.driver_connection.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)
    pooled = repo.engine.raw_connection()
    try:
        assert pooled.driver_connection.execute("PRAGMA wal_autocheckpoint").fetchone() == (1000,)
    finally:
        pooled.close()


def test_starts_on_the_event_loop_keep_the_wal_short_and_every_job_stored(
    repo: JobRepository, tmp_path: Path
) -> None:
    """Without other writers, inline starts alone would grow the WAL by every page they write; the
    checkpoints made beside them keep it to about a hundred starts' pages, and nothing is lost."""
    starts = 6 * INLINE_COMMITS_PER_CHECKPOINT

    async def main() -> None:
        await _start_inline(Store.of(repo), starts)

    asyncio.run(main())
    repo.wait_for_checkpoint(10)
    database = tmp_path / "handles.db"
    frames = _wal_frames(database)
    # A start writes about a dozen pages (the row and its nine indexes): 600 starts never checkpointed
    # leave about 7,000 frames in the WAL; checkpointed every hundred, at most a few hundred starts' worth.
    assert frames < 3 * INLINE_COMMITS_PER_CHECKPOINT * 12, frames
    count = sqlite3.connect(database).execute("SELECT count(*) FROM handles_jobs").fetchone()
    assert count == (starts,)


def test_a_checkpoint_runs_on_a_thread_of_its_own_one_at_a_time(repo: JobRepository) -> None:
    threads: list[str] = []
    running = threading.Semaphore(1)
    overlapped: list[bool] = []
    real = repo.checkpoint

    def recorded() -> None:
        threads.append(threading.current_thread().name)
        if not running.acquire(blocking=False):
            overlapped.append(True)
            return
        try:
            real()
        finally:
            running.release()

    repo.checkpoint = recorded  # type: ignore[method-assign]

    async def main() -> None:
        await _start_inline(Store.of(repo), 5 * INLINE_COMMITS_PER_CHECKPOINT)

    asyncio.run(main())
    repo.wait_for_checkpoint(10)
    assert threads, "no checkpoint ran"
    assert set(threads) == {"handles-sqlite-checkpoint"}, threads
    assert overlapped == []
