"""A running job's writes on PostgreSQL past the ORM session, on psycopg's own connection.

Its outcome (`JobRepository.transition`): one write transaction (`_transition_direct`), storing exactly what
the ORM's path stores, with its change notice inside the transaction, and SQLAlchemy's errors when the
database fails it. Its progress reports (`JobRepository.set_progress`): one statement in autocommit, whose
change notice goes out only when it changed the row."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from handles.states import Status
from handles.store import JobRecord, JobRepository, utc_now
from handles.store.repository import _notice
from tests.harness.postgres import notices, repository, round_trips, terminate_backends
from tests.runtime.support import job_row

OWNER = "node-a"


def _id() -> str:
    return f"o-{secrets.token_hex(6)}"


def _principal() -> str:
    return f"local:o-{secrets.token_hex(4)}"  # the schema is shared by this file's tests: one principal each


@pytest.fixture
def repo(postgres_url: str) -> Iterator[JobRepository]:
    with repository(postgres_url) as repo:
        yield repo


def _running(repo: JobRepository, principal: str, **fields: Any) -> JobRecord:
    """A job stored claimed by `OWNER`, as a start that claims at insert stores it."""
    now = utc_now()
    claim = {
        "lease_owner": OWNER,
        "lease_expires_at": now + timedelta(seconds=30),
        "attempts": 1,
        "started_at": now,
    }
    stored, created = repo.insert(job_row(_id(), principal=principal, **(claim | fields)), active_limit=10)
    assert created
    return stored


def _columns(job: JobRecord | None) -> dict[str, Any]:
    assert job is not None
    return job.model_dump(exclude={"id"})


OUTCOMES: list[tuple[Status, dict[str, Any]]] = [
    (
        Status.COMPLETED,
        {
            "result": {
                "content": [{"type": "text", "text": "done «ok»"}],
                "structuredContent": {"sum": 0.1 + 0.2, "tiny": 5e-324, "big": 2**63 + 1, "nul": "a\x00b"},
            }
        },
    ),
    (
        Status.FAILED,
        {"error": {"code": -32603, "message": "boom", "data": {"reason": "crashed", "n": [1, None]}}},
    ),
    (Status.CANCELLED, {"status_message": "Cancelled by its caller."}),
    (Status.INPUT_REQUIRED, {"status_message": "Which one, «a» or «b»?"}),
]


@pytest.mark.parametrize(("target", "values"), OUTCOMES, ids=[target.value for target, _ in OUTCOMES])
def test_an_outcome_stores_exactly_what_the_orms_path_stores(
    repo: JobRepository, target: Status, values: dict[str, Any]
) -> None:
    now = utc_now()
    repo.clock = lambda: now  # both paths stamp the same time
    principal = _principal()
    then = now - timedelta(seconds=5)
    times = {"created_at": then, "updated_at": then, "run_after": then, "started_at": then}
    times |= {"expires_at": then + timedelta(hours=1), "lease_expires_at": then + timedelta(seconds=30)}
    direct, orm = (_running(repo, principal, **times) for _ in range(2))
    assert _columns(repo.get(direct.id)) == _columns(repo.get(orm.id))

    assert repo.transition(direct.id, target, owner=OWNER, **values)
    assert repo._transition_orm(orm.id, target, OWNER, False, now, values)

    stored = repo.get(direct.id)
    assert _columns(stored) == _columns(repo.get(orm.id))
    assert stored is not None and stored.status == target.value and stored.version == direct.version + 1
    for name, value in values.items():
        assert getattr(stored, name) == value


def test_an_outcome_refused_by_the_transition_table_or_the_lease_changes_nothing(repo: JobRepository) -> None:
    job = _running(repo, _principal())
    assert not repo.transition(job.id, Status.COMPLETED, owner="node-b", result={"content": []})
    assert repo.transition(job.id, Status.COMPLETED, owner=OWNER, result={"content": []})
    ended = repo.get(job.id)
    assert not repo.transition(job.id, Status.FAILED, owner=OWNER, error={"code": 1, "message": "late"})
    assert repo.get(job.id) == ended
    assert not repo.transition(_id(), Status.COMPLETED, owner=OWNER)  # no such job


def test_an_outcome_sends_its_notice_once_it_commits(
    repo: JobRepository, listener: psycopg.Connection
) -> None:
    job = _running(repo, _principal())
    notices(listener, job.id, 0.2)  # the start's own, if any
    assert repo.publishing(job.id, "origin-1", False, repo.transition, job.id, Status.COMPLETED, owner=OWNER)
    assert notices(listener, job.id) == [_notice(job.id, "origin-1", False)]


def test_an_outcome_the_database_refuses_is_rolled_back_with_no_notice_and_the_next_one_is_stored(
    repo: JobRepository, listener: psycopg.Connection
) -> None:
    """A text column cannot hold NUL on PostgreSQL: the UPDATE fails after the row was read and locked in
    the transaction. Nothing is stored, no notice goes out, the error is SQLAlchemy's, and the connection
    goes back to the pool fit for the next write (which finds the row unlocked)."""
    job = _running(repo, _principal())
    notices(listener, job.id, 0.2)
    with pytest.raises(DBAPIError):
        repo.publishing(
            job.id,
            "origin-1",
            False,
            repo.transition,
            job.id,
            Status.CANCELLED,
            owner=OWNER,
            status_message="a\x00b",
        )
    assert repo.get(job.id) == job
    assert notices(listener, job.id) == []
    assert repo.publishing(job.id, "origin-1", False, repo.transition, job.id, Status.CANCELLED, owner=OWNER)
    stored = repo.get(job.id)
    assert (
        stored is not None and stored.status == Status.CANCELLED.value and stored.version == job.version + 1
    )
    assert notices(listener, job.id) == [_notice(job.id, "origin-1", False)]


def test_an_outcome_after_the_server_dropped_the_pooled_connections_is_stored_on_a_fresh_one(
    postgres_url: str,
) -> None:
    """The write engine pings a connection at checkout (as for the ORM's path), so an outcome written after
    a restart or a failover dropped the pooled connections is stored at the first try."""
    name = f"handles_outcome_drop_{secrets.token_hex(4)}"
    principal = _principal()
    with repository(postgres_url, application_name=name) as repo:
        first, second = _running(repo, principal), _running(repo, principal)
        assert repo.transition(first.id, Status.COMPLETED, owner=OWNER)  # a pooled write connection now
        assert terminate_backends(postgres_url, name) >= 1
        assert repo.transition(second.id, Status.COMPLETED, owner=OWNER)
    with repository(postgres_url) as reader:  # this repository's reads meet their dropped connection once
        stored = reader.get(second.id)
    assert stored is not None and stored.status == Status.COMPLETED.value and stored.lease_owner is None


def test_an_outcome_is_written_past_the_orm_session_but_a_check_of_an_expired_lease_by_the_database_clock(
    repo: JobRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    orm_calls: list[str] = []
    orm = repo._transition_orm

    def through_the_orm(job_id: str, *args: Any) -> bool:
        orm_calls.append(job_id)
        return orm(job_id, *args)

    monkeypatch.setattr(repo, "_transition_orm", through_the_orm)
    assert repo.database_leases
    ended = _running(repo, _principal())
    assert repo.transition(ended.id, Status.COMPLETED, owner=OWNER, result={"content": []})
    assert orm_calls == []
    # Recovery's check that a lease ran out is judged by the database's clock, in the ORM's transaction.
    expired = _running(repo, _principal(), lease_expires_at=utc_now() - timedelta(seconds=1))
    assert repo.transition(
        expired.id, Status.FAILED, lease_expired=True, error={"code": 1, "message": "lost"}
    )
    assert orm_calls == [expired.id]


def test_a_progress_report_is_stored_by_its_lease_holder_while_the_job_is_active(repo: JobRepository) -> None:
    now = utc_now()
    repo.clock = lambda: now
    job = _running(repo, _principal())
    assert repo.set_progress(job.id, OWNER, 2.5, 10.0, "A quarter «done».")
    stored = repo.get(job.id)
    assert stored is not None
    assert (stored.progress_done, stored.progress_total, stored.status_message) == (
        2.5,
        10.0,
        "A quarter «done».",
    )
    assert (stored.updated_at, stored.version) == (now, job.version + 1)
    assert _columns(stored) | {"progress_done": None, "progress_total": None} == _columns(job) | {
        "progress_done": None,
        "progress_total": None,
        "status_message": "A quarter «done».",
        "updated_at": now,
        "version": job.version + 1,
    }
    assert not repo.set_progress(job.id, "node-b", 3, 10, "not the lease holder")
    assert repo.transition(job.id, Status.COMPLETED, owner=OWNER)
    ended = repo.get(job.id)
    assert not repo.set_progress(job.id, OWNER, 4, 10, "after its end")
    assert repo.get(job.id) == ended
    assert not repo.set_progress(_id(), OWNER, 1, 2, "no such job")


def test_a_progress_report_is_one_round_trip_and_announced_only_when_stored(
    repo: JobRepository, listener: psycopg.Connection
) -> None:
    job = _running(repo, _principal())
    notices(listener, job.id, 0.2)

    def report() -> None:
        assert repo.publishing(job.id, "origin-1", False, repo.set_progress, job.id, OWNER, 1, 4, "a quarter")

    assert round_trips(repo, report) == (1, ["WITH"])  # WITH changed AS (UPDATE ...) SELECT pg_notify(...)
    assert notices(listener, job.id) == [_notice(job.id, "origin-1", False)] * 2
    assert not repo.publishing(
        job.id, "origin-1", False, repo.set_progress, job.id, "node-b", 2, 4, "refused"
    )
    assert notices(listener, job.id) == []
    stored = repo.get(job.id)
    assert stored is not None and stored.status_message == "a quarter"


def test_a_steps_writes_send_their_notice_once_they_commit_and_one_refused_sends_none(
    repo: JobRepository, listener: psycopg.Connection
) -> None:
    """A step's start and outcome are written in one transaction each on psycopg's own connection
    (`_postgres_writing`), their notice sent in it. A text column cannot hold NUL on PostgreSQL: an
    outcome with one fails after the job's row was read and locked; nothing is stored, no notice goes out,
    the error is SQLAlchemy's, and the next write finds the row unlocked."""
    job = _running(repo, _principal())
    notices(listener, job.id, 0.2)
    record, fresh = repo.publishing(job.id, "origin-1", False, repo.begin_step, job.id, OWNER, "charge", 1)
    assert fresh and record.status == "started"
    assert notices(listener, job.id) == [_notice(job.id, "origin-1", False)]
    touched = repo.get(job.id)
    with pytest.raises(DBAPIError):
        repo.publishing(
            job.id, "origin-1", False, repo.finish_step, job.id, OWNER, "charge", error="Refused: a\x00b"
        )
    assert notices(listener, job.id) == []
    assert repo.get(job.id) == touched and repo.steps(job.id)[0].status == "started"
    repo.publishing(job.id, "origin-1", False, repo.finish_step, job.id, OWNER, "charge", error="Refused")
    assert notices(listener, job.id) == [_notice(job.id, "origin-1", False)]
    assert [(s.status, s.error) for s in repo.steps(job.id)] == [("failed", "Refused")]


def test_a_steps_writes_are_one_statement_each_and_store_what_the_sqlite_path_stores(
    repo: JobRepository,
) -> None:
    """Counted from libpq's trace: each write is one statement in autocommit (its own transaction) on a
    connection the write pool pinged at checkout. A started step's result is stored as JSON's null, as
    the insert on SQLite (and the ORM before) stores it, for a new step and for a failed one started
    again."""
    job = _running(repo, _principal())
    names = iter(range(4))

    def begin() -> None:
        repo.begin_step(job.id, OWNER, f"step {next(names)}", 1)

    finishing = iter(range(4))

    def finish() -> None:
        repo.finish_step(job.id, OWNER, f"step {next(finishing)}", result={"rows": 3})

    assert round_trips(repo, begin) == (2, [";", "WITH"])
    assert round_trips(repo, finish) == (2, [";", "WITH"])
    repo.finish_step(job.id, OWNER, "step 1", error="refused")  # not started: nothing changes
    repo.begin_step(job.id, OWNER, "refused", 1)
    repo.finish_step(job.id, OWNER, "refused", error="Timeout")
    repo.begin_step(job.id, OWNER, "refused", 2)
    with repo._write_engine.connect() as connection:
        stored = connection.execute(
            text(
                "select name, status, attempt, result is null, cast(result as text), error, finished_at is null "
                "from handles_steps where job_id = :job_id order by name"
            ),
            {"job_id": job.id},
        ).all()
    assert [tuple(row) for row in stored] == [
        ("refused", "started", 2, False, "null", None, True),
        ("step 0", "completed", 1, False, '{"rows": 3}', None, False),
        ("step 1", "completed", 1, False, '{"rows": 3}', None, False),
    ]


def test_a_step_write_after_the_server_dropped_the_pooled_connections_is_stored_at_the_first_try(
    postgres_url: str,
) -> None:
    """A step's writes run on the write pool's connections, pinged at checkout: a restart or a failover that
    dropped them costs no step its write (a failed step write would end the job's run)."""
    name = f"handles_step_drop_{secrets.token_hex(4)}"
    with repository(postgres_url, application_name=name) as repo:
        job = _running(repo, _principal())
        repo.begin_step(job.id, OWNER, "fetch", 1)  # a pooled write connection now
        assert terminate_backends(postgres_url, name) >= 1
        repo.finish_step(job.id, OWNER, "fetch", result={"rows": 3})
        assert terminate_backends(postgres_url, name) >= 1
        assert repo.begin_step(job.id, OWNER, "send", 1)[1]
    with repository(postgres_url) as reader:
        assert [(s.name, s.status) for s in reader.steps(job.id)] == [
            ("fetch", "completed"),
            ("send", "started"),
        ]


def test_a_step_write_gives_its_connection_back_to_the_pool_for_transactions(repo: JobRepository) -> None:
    """A step's write switches its pooled connection to autocommit for its one statement and back: the
    next write on that connection (a job's outcome: a row read, an UPDATE and the notice) is one
    transaction again, not three statements each committed alone."""
    job = _running(repo, _principal())
    repo._write_engine.dispose()
    repo.begin_step(job.id, OWNER, "fetch", 1)
    repo.finish_step(job.id, OWNER, "fetch", result=None)
    assert repo._write_engine.pool.checkedin() == 1  # the one connection both writes used, back in the pool
    pooled = repo._write_engine.raw_connection()
    try:
        assert pooled.driver_connection.autocommit is False
    finally:
        pooled.close()
    assert round_trips(repo, lambda: repo.transition(job.id, Status.WORKING, owner=OWNER))[1][:2] == [
        ";",
        "BEGIN",
    ]
