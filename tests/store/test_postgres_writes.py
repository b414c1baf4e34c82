"""A running job's writes on PostgreSQL past the ORM session, on psycopg's own connection.

Its outcome (`JobRepository.transition`): one compare-and-set statement (`PostgresOps.transition`), storing exactly what
the ORM's path stores, its change notice sent once it has committed, and SQLAlchemy's errors when the
database fails it. Its progress reports (`JobRepository.set_progress`): one statement in autocommit, whose
change notice goes out only when it changed the row."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from handles.states import TERMINAL, Status
from handles.store import JobRecord, JobRepository, utc_now
from handles.store.rules import _transitioned
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


@pytest.mark.parametrize("keep_result_seconds", [None, 1.5, 7200.0])
@pytest.mark.parametrize(("target", "values"), OUTCOMES, ids=[target.value for target, _ in OUTCOMES])
def test_an_outcome_stores_what_the_transition_rules_give(
    repo: JobRepository, target: Status, values: dict[str, Any], keep_result_seconds: float | None
) -> None:
    """PostgreSQL writes an outcome as one UPDATE whose changes are SQL; the SQLite file applies the same rules
    in Python (`_transitioned`). What PostgreSQL stores is, column for column, what those rules
    give the row, with a result's awkward numbers and a NUL intact, and a terminal job's retention
    shortened to `keep_result_seconds` from now (1.5 s), or left as it was when that is later (2 h)."""
    now = utc_now()
    repo.clock = lambda: now
    then = now - timedelta(seconds=5)
    times = {"created_at": then, "updated_at": then, "run_after": then, "started_at": then}
    times |= {"expires_at": then + timedelta(hours=1), "lease_expires_at": then + timedelta(seconds=30)}
    times |= {"input_deadline": then + timedelta(minutes=5), "abandon_at": then + timedelta(minutes=9)}
    job = _running(repo, _principal(), keep_result_seconds=keep_result_seconds, **times)
    before = repo.get(job.id)
    assert before is not None
    expected = SimpleNamespace(**before.model_dump())
    _transitioned(expected, target, now, values)

    assert repo.transition(job.id, target, owner=OWNER, **values)
    stored = repo.get(job.id)
    assert _columns(stored) == {name: value for name, value in vars(expected).items() if name != "id"}
    assert stored is not None and stored.status == target.value and stored.version == job.version + 1
    if target in TERMINAL:
        shortened = keep_result_seconds == 1.5
        assert stored.expires_at == (now + timedelta(seconds=1.5) if shortened else before.expires_at)


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
    assert repo.publishing(
        job.id, "origin-1", "changed", repo.transition, job.id, Status.COMPLETED, owner=OWNER
    )
    assert notices(listener, job.id) == [repo.notice(job.id, "origin-1", "changed")]


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
            "changed",
            repo.transition,
            job.id,
            Status.CANCELLED,
            owner=OWNER,
            status_message="a\x00b",
        )
    assert repo.get(job.id) == job
    assert notices(listener, job.id) == []
    assert repo.publishing(
        job.id, "origin-1", "changed", repo.transition, job.id, Status.CANCELLED, owner=OWNER
    )
    stored = repo.get(job.id)
    assert (
        stored is not None and stored.status == Status.CANCELLED.value and stored.version == job.version + 1
    )
    assert notices(listener, job.id) == [repo.notice(job.id, "origin-1", "changed")]


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


def test_recoverys_check_that_a_lease_ran_out_is_judged_by_the_database_clock(postgres_url: str) -> None:
    """A node whose clock runs ten minutes ahead sees every live lease as run out. Recovery's transition
    (`lease_expired=True`) asks the database's clock, so it leaves a live job alone and ends one whose lease
    did run out; with `lease_clock="local"` the node's own clock decides."""
    ahead = lambda: utc_now() + timedelta(minutes=10)  # noqa: E731
    principal = _principal()
    for lease_clock, live_taken in (("database", False), ("local", True)):
        skewed = JobRepository(postgres_url, clock=ahead, lease_clock=lease_clock)
        try:
            live = _running(skewed, principal, lease_expires_at=utc_now() + timedelta(seconds=30))
            ran_out = _running(skewed, principal, lease_expires_at=utc_now() - timedelta(seconds=1))
            lost = {"code": 1, "message": "lost"}
            assert skewed.transition(live.id, Status.FAILED, lease_expired=True, error=lost) is live_taken
            assert skewed.transition(ran_out.id, Status.FAILED, lease_expired=True, error=lost)
            stored = skewed.get(live.id)
            assert stored is not None and stored.status == (
                Status.FAILED.value if live_taken else Status.WORKING.value
            )
        finally:
            skewed.dispose()


def test_an_outcome_is_one_statement(repo: JobRepository) -> None:
    """Counted from libpq's trace: the write pool's ping and the compare-and-set `WITH changed AS (UPDATE
    ...)`, in autocommit."""
    jobs = iter([_running(repo, _principal()) for _ in range(2)])
    assert round_trips(repo, lambda: repo.transition(next(jobs).id, Status.COMPLETED, owner=OWNER)) == (
        2,
        [";", "WITH"],
    )


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
        assert repo.publishing(
            job.id, "origin-1", "reported", repo.set_progress, job.id, OWNER, 1, 4, "a quarter"
        )

    assert round_trips(repo, report) == (1, ["WITH"])  # WITH changed AS (UPDATE ...) SELECT id
    received = notices(listener, job.id)  # the two reports' notices, once if they went out together
    assert received and set(received) == {repo.notice(job.id, "origin-1", "reported")}
    assert not repo.publishing(
        job.id, "origin-1", "reported", repo.set_progress, job.id, "node-b", 2, 4, "refused"
    )
    assert notices(listener, job.id) == []
    stored = repo.get(job.id)
    assert stored is not None and stored.status_message == "a quarter"


def test_a_steps_writes_send_their_notice_once_they_commit_and_one_refused_sends_none(
    repo: JobRepository, listener: psycopg.Connection
) -> None:
    """A step's start and outcome are one statement each, its own transaction, on psycopg's own connection,
    their notice sent by it. A text column cannot hold NUL on PostgreSQL: an outcome with one fails after
    the job's row was locked; nothing is stored, no notice goes out, the error is SQLAlchemy's, and the
    next write finds the row unlocked."""
    job = _running(repo, _principal())
    notices(listener, job.id, 0.2)
    record, fresh = repo.publishing(
        job.id, "origin-1", "reported", repo.begin_step, job.id, OWNER, "charge", 1
    )
    assert fresh and record.status == "started"
    assert notices(listener, job.id) == [repo.notice(job.id, "origin-1", "reported")]
    touched = repo.get(job.id)
    with pytest.raises(DBAPIError):
        repo.publishing(
            job.id, "origin-1", "reported", repo.finish_step, job.id, OWNER, "charge", error="Refused: a\x00b"
        )
    assert notices(listener, job.id) == []
    assert repo.get(job.id) == touched and repo.steps(job.id)[0].status == "started"
    repo.publishing(
        job.id, "origin-1", "reported", repo.finish_step, job.id, OWNER, "charge", error="Refused"
    )
    assert notices(listener, job.id) == [repo.notice(job.id, "origin-1", "reported")]
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
    with repo.engine.connect() as connection:
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
    next write on that connection through the ORM session (a heartbeat, a claim, a question asked: reads
    and writes that must commit together) is one transaction again, not statements each committed
    alone."""
    job = _running(repo, _principal())
    repo.engine.dispose()
    repo.begin_step(job.id, OWNER, "fetch", 1)
    repo.finish_step(job.id, OWNER, "fetch", result=None)
    assert repo.engine.pool.checkedin() == 1  # the one connection both writes used, back in the pool
    pooled = repo.engine.raw_connection()
    try:
        assert pooled.driver_connection.autocommit is False
    finally:
        pooled.close()
