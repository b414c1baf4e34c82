"""A hot read on the event loop on an SQLite file (`read_inline`) runs on one long-lived connection of
SQLite's own, under a lock: a read that fails there drops that connection (the next read gets a fresh one,
in a known state), releases the lock, and comes out as SQLAlchemy's exception when SQLite raised it (so
`Store.read` sends a locked read to a worker thread)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from handles.store import InputRequestRecord, JobRepository, JobState, utc_now
from tests.harness.postgres import repository
from tests.runtime.support import job_row


@pytest.fixture
def repo(tmp_path: Path) -> Iterator[JobRepository]:
    with repository(f"sqlite:///{tmp_path / 'handles.db'}") as repo:
        yield repo


def _failing_read(repo: JobRepository, error: BaseException) -> object:
    def read() -> object:
        with repo._sqlite_reading() as raw:
            assert raw is not None, "an inline read runs on SQLite's own connection"
            raw.execute("SELECT 1").fetchall()
            raise error

    return read


@pytest.mark.parametrize(
    ("error", "comes_out_as"),
    [(sqlite3.OperationalError("database is locked"), OperationalError), (ValueError("a bug"), ValueError)],
    ids=["sqlite-error", "other-error"],
)
def test_a_failed_inline_read_drops_its_connection_releases_the_lock_and_the_next_read_works(
    repo: JobRepository, error: BaseException, comes_out_as: type[BaseException]
) -> None:
    job = job_row("inline-1")
    repo.insert(job)
    whole = repo.get(job.id)
    assert whole is not None and repo.read_inline(repo.snapshot, job.id)[0] == JobState.of(whole)
    before = repo._inline_connection
    assert before is not None

    with pytest.raises(comes_out_as) as caught:
        repo.read_inline(_failing_read(repo, error))
    if comes_out_as is OperationalError:
        assert caught.value.orig is error
    assert repo._inline_connection is None, "the failed read's connection is dropped"
    assert repo._inline_lock.acquire(blocking=False), "the inline lock is released"
    repo._inline_lock.release()

    job_after, pending, steps = repo.read_inline(repo.snapshot, job.id)
    assert job_after == JobState.of(whole) and pending == [] and steps == []
    assert repo._inline_connection is not None and repo._inline_connection is not before


def test_off_the_event_loop_there_is_no_inline_connection(repo: JobRepository) -> None:
    with repo._sqlite_reading() as raw:
        assert raw is None
    assert repo._inline_connection is None


def test_a_snapshot_reads_the_same_on_the_event_loop_and_off_it(repo: JobRepository) -> None:
    job = job_row("inline-2", status="input_required")
    now = utc_now()
    repo.insert(
        job,
        questions=[
            InputRequestRecord(job_id=job.id, key=key, message=key, requested_schema={}, created_at=now)
            for key in ("b", "a")
        ],
    )
    repo.begin_step(job.id, None, "fetch", 1)
    inline = repo.read_inline(repo.snapshot, job.id)
    threaded = repo.snapshot(job.id)
    assert inline == threaded
    assert [q.key for q in inline[1]] == ["a", "b"] and [s.name for s in inline[2]] == ["fetch"]


def test_a_poll_on_the_event_loop_is_one_statement_and_two_while_the_job_waits_for_answers(
    repo: JobRepository,
) -> None:
    """The job's state and its steps' come in one statement; its open questions in a second, only while it
    waits for answers."""
    job = job_row("inline-3", status="input_required")
    question = InputRequestRecord(
        job_id=job.id, key="q", message="?", requested_schema={}, created_at=utc_now()
    )
    repo.insert(job, questions=[question])
    for name in ("fetch", "send"):
        repo.begin_step(job.id, None, name, 1)
    repo.read_inline(repo.snapshot, job.id)  # opens the inline connection
    assert repo._inline_connection is not None
    raw = repo._inline_connection.connection.driver_connection
    assert raw is not None
    statements: list[str] = []
    raw.set_trace_callback(statements.append)
    try:
        waiting = repo.read_inline(repo.snapshot, job.id)
        assert [q.key for q in waiting[1]] == ["q"] and len(waiting[2]) == 2 and len(statements) == 2
        repo.answer_inputs(job.id, {"q": {}})
        statements.clear()
        working = repo.read_inline(repo.snapshot, job.id)
    finally:
        raw.set_trace_callback(None)
    assert working[0] is not None and working[0].status == "working" and working[1] == []
    assert [s.name for s in working[2]] == ["fetch", "send"] and len(statements) == 1, statements
