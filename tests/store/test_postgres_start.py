"""A start on PostgreSQL is one call of `handles_start` (migration 0011), one round trip (issue 14),
and keeps every meaning of `JobRepository.insert`: the per-principal limit, the idempotency key, the
claim at insert with its lease by the database clock, the questions asked first, and the change
notice that wakes another connection. A progress poll's snapshot (the job, its open questions, its
steps) is one statement too. Counted with bench/round_trips.py's libpq protocol tracer."""

from __future__ import annotations

import asyncio
import secrets
import socket
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from handles.errors import StoreUnavailable
from handles.states import Status
from handles.store import InputRequestRecord, JobRepository, JobState, Store, utc_now
from handles.store.listen import libpq_url
from handles.store.repository import ActiveLimitReached
from handles.store.rules import _job_values
from handles.store.statements import _START
from tests.harness.database import own_connection
from tests.harness.postgres import (
    fresh_schema,
    notices,
    payloads,
    repository,
    round_trips,
    terminate_backends,
)
from tests.runtime.support import job_row, start_in
from tests.support import claim, count_active, step_state


def _principal() -> str:
    return f"local:p-{secrets.token_hex(4)}"  # the schema is shared by this file's tests: one principal each


def _id() -> str:
    return f"s-{secrets.token_hex(6)}"


@pytest.fixture
def repo(postgres_url: str) -> Iterator[JobRepository]:
    with repository(postgres_url) as repo:
        yield repo


def test_the_start_function_exists_after_the_migration(repo: JobRepository, postgres_url: str) -> None:
    with own_connection(postgres_url) as connection:
        found = connection.execute(
            text(
                "select count(*) from pg_proc p join pg_namespace n on n.oid = p.pronamespace "
                "where p.proname = 'handles_start' and n.nspname = current_schema()"
            )
        ).scalar_one()
    assert found == 1


def test_a_start_is_one_round_trip(repo: JobRepository) -> None:
    principal = _principal()

    def start() -> None:
        job = job_row(_id(), principal=principal, lease_owner="node-a", attempts=1)
        repo.publishing(job.id, "node-a", "changed", repo.insert, job, active_limit=50, lease_seconds=30)

    trips, sent = round_trips(repo, start)
    assert trips == 1, sent
    assert sent == ["SELECT handles_start"]


def test_a_starts_active_count_reads_only_the_principals_active_jobs_whatever_plan_its_session_keeps(
    postgres_url: str,
) -> None:
    """A start counts its principal's active jobs inside `handles_start`, on a pooled connection that lives as
    long as the server and keeps its plan of the function's statements. In a table with no statistics yet (a
    new deployment, until autovacuum first analyses it), the count's generic plan with `status IN (...)` read
    the principal's index entries by principal alone and filtered the statuses: every start read every job
    the principal had stored, and one session's starts grew slower with each (in bench's loop, 1.1 -> 2.1 ms
    over 4,000 starts of one principal, where a fresh connection's stayed flat). Here the session is made to
    keep the generic plan from its first call, in a fresh schema: the start after 40 ended jobs of its
    principal must read none of them."""
    with fresh_schema(postgres_url.split("?")[0], "handles_count") as url, repository(url) as repo:
        principal = _principal()
        start = repo._prepare(_START)
        with psycopg.connect(libpq_url(url), autocommit=True) as session:
            session.execute("SET plan_cache_mode = force_generic_plan")  # the plan a long-lived session keeps

            def call(status: Status) -> None:
                values = _job_values(job_row(_id(), principal=principal, status=status.value))
                parameters = repo._engine._start_parameters(values, 50, (), None)
                (row,) = session.execute(start.sql, start.parameters(parameters)).fetchall()
                assert row[0] == "created", row

            for _ in range(40):
                call(Status.COMPLETED)  # the principal's history: ended jobs, never active (no dead versions)
            with session.transaction():  # no backend flushes its statistics inside a transaction
                before = _entries_read(session, "ix_handles_jobs_principal_key_status")
                call(Status.WORKING)
                read = _entries_read(session, "ix_handles_jobs_principal_key_status") - before
    assert read == 0, f"the start's count read {read} index entries of its principal's 40 ended jobs"


def _entries_read(session: psycopg.Connection[Any], index: str) -> int:
    """The entries this session has read from `index` and not yet reported (a count that only grows within a
    transaction: compare two readings of one transaction)."""
    row = session.execute("SELECT pg_stat_get_xact_tuples_returned(%s::regclass)", (index,)).fetchone()
    assert row is not None
    return int(row[0])


def test_a_start_over_the_limit_stores_nothing_and_announces_nothing(
    repo: JobRepository, listener: psycopg.Connection
) -> None:
    principal = _principal()
    first = job_row(_id(), principal=principal)
    stored, created = repo.publishing(first.id, "node-a", "queued", repo.insert, first, active_limit=1)
    assert created and stored.id == first.id
    assert notices(listener, first.id) == [f"{first.id} node-a queued"], "the notice wakes another connection"

    refused = job_row(_id(), principal=principal)
    with pytest.raises(ActiveLimitReached) as caught:
        repo.publishing(refused.id, "node-a", "queued", repo.insert, refused, active_limit=1)
    assert (caught.value.active, caught.value.limit) == (1, 1)
    assert repo.get(refused.id) is None
    assert notices(listener, refused.id) == []

    other = job_row(_id(), principal=_principal())  # another principal's count is its own
    assert repo.insert(other, active_limit=1)[1]


def test_only_a_start_that_waits_for_a_worker_is_announced(
    repo: JobRepository, listener: psycopg.Connection
) -> None:
    """A job stored claimed by its node, or waiting for its first answer, is news to no one (nobody
    can wait for a job before its start commits): no notice, no listener woken on any node. A job
    that waits for a worker is announced, so idle workers elsewhere look for it at once."""
    principal = _principal()
    claimed = job_row(_id(), principal=principal, lease_owner="node-a", attempts=1)
    waiting = job_row(_id(), principal=principal, status="input_required")
    queued = job_row(_id(), principal=principal)
    store = Store.of(repo)
    store.origin = "node-a"

    async def start_all() -> None:
        assert (await start_in(store, claimed, queued=False, active_limit=50, lease_seconds=30))[1]
        assert (await start_in(store, waiting, queued=False, active_limit=50))[1]
        assert (await start_in(store, queued, queued=True, active_limit=50))[1]

    asyncio.run(start_all())
    # This store's notices only: the channel is the whole database's, and a node of a test running beside
    # this one (another pytest worker) may publish that it touched one of these jobs.
    ours = [payload for payload in payloads(listener) if payload.split(" ")[1:2] == ["node-a"]]
    assert ours == [f"{queued.id} node-a queued"]
    assert all(repo.get(job.id) is not None for job in (claimed, waiting, queued))


def test_an_idempotency_key_returns_the_stored_job_exactly_as_stored(
    repo: JobRepository, listener: psycopg.Connection
) -> None:
    principal = _principal()
    first = job_row(
        _id(),
        principal=principal,
        idempotency_key="key-1",
        arguments={"name": "é", "n": [1, 2.5, None]},
        progress_done=3.0,
        progress_total=7.0,
        keep_result_seconds=60.0,
    )
    assert repo.insert(first, active_limit=1)[1]
    notices(listener, first.id, 0.2)
    again = job_row(_id(), principal=principal, idempotency_key="key-1", arguments={"other": True})
    # At the limit already: the key's job comes back rather than a refusal, and nothing is announced.
    returned, created = repo.publishing(again.id, "node-a", "changed", repo.insert, again, active_limit=1)
    assert not created
    assert returned == repo.get(first.id)
    assert isinstance(returned.progress_done, float) and returned.created_at.tzinfo is not None
    assert repo.get(again.id) is None
    assert notices(listener, again.id) == []
    assert repo.insert(job_row(_id(), principal=principal, idempotency_key="key-1", kind="other"))[1]


def test_a_claimed_start_stores_its_questions_and_its_lease_by_the_database_clock(
    repo: JobRepository,
) -> None:
    now = utc_now()
    job = job_row(_id(), principal=_principal(), lease_owner="node-a", attempts=1, started_at=now)
    question = InputRequestRecord(
        job_id=job.id, key="first", message="Go?", requested_schema={"type": "object"}, created_at=now
    )
    returned, created = repo.insert(job, active_limit=5, questions=[question], lease_seconds=30)
    assert created
    stored = repo.get(job.id)
    assert stored is not None and stored.lease_owner == "node-a" and stored.lease_expires_at is not None
    assert returned.lease_expires_at == stored.lease_expires_at
    assert 25 < (stored.lease_expires_at - utc_now()).total_seconds() <= 31
    assert [(q.key, q.message, q.requested_schema, q.created_at) for q in repo.questions(job.id)] == [
        ("first", "Go?", {"type": "object"}, now)
    ]


def test_a_start_tried_again_after_its_reply_was_lost_is_stored_once_and_answered_as_created(
    repo: JobRepository, listener: psycopg.Connection
) -> None:
    """The second try of one start (same id) finds the first one's row: created, not refused by the
    limit it now fills itself, not stored twice, and announced (the try whose reply was lost never got to
    queue its notice)."""
    job = job_row(_id(), principal=_principal(), lease_owner="node-a", attempts=1)
    first, created = repo.publishing(
        job.id, "node-a", "changed", repo.insert, job, active_limit=1, lease_seconds=30
    )
    assert created
    assert notices(listener, job.id) == [f"{job.id} node-a changed"]
    second, created = repo.publishing(
        job.id, "node-a", "changed", repo.insert, job, active_limit=1, lease_seconds=30
    )
    assert created and second == repo.get(job.id) and second.lease_expires_at == first.lease_expires_at
    assert notices(listener, job.id) == [f"{job.id} node-a changed"]
    assert count_active(repo, principal=job.principal) == 1


def test_a_start_on_a_connection_the_server_dropped_is_made_once_more_on_a_fresh_one(
    postgres_url: str,
) -> None:
    name = f"handles_start_drop_{secrets.token_hex(4)}"
    principal = _principal()
    with repository(postgres_url, application_name=name) as repo:
        assert repo.insert(job_row(_id(), principal=principal), active_limit=5)[1]  # a pooled connection now
        assert terminate_backends(postgres_url, name) >= 1
        job = job_row(_id(), principal=principal)
        stored, created = repo.insert(job, active_limit=5)
        assert created and stored.id == job.id
        assert repo.get(job.id) is not None
        assert count_active(repo, principal=principal) == 2


def test_a_start_after_the_server_dropped_every_pooled_connection_is_made_once_more_on_a_fresh_one(
    postgres_url: str,
) -> None:
    """The start runs on psycopg's own connection (change 17): a dropped one still comes out as
    SQLAlchemy's invalidated error, and, as SQLAlchemy's own connections do, the whole pool is renewed,
    so the one repeated try does not meet another dead connection of the same pool."""
    name = f"handles_start_drop_all_{secrets.token_hex(4)}"
    principal = _principal()
    with repository(postgres_url, application_name=name) as repo:
        held = [repo._read_engine.raw_connection() for _ in range(3)]
        for pooled in held:
            pooled.driver_connection.execute("select 1")
        for pooled in held:
            pooled.close()
        assert repo._read_engine.pool.checkedin() == 3  # type: ignore[attr-defined]
        assert terminate_backends(postgres_url, name) >= 3
        job = job_row(_id(), principal=principal, lease_owner="node-a", attempts=1)
        stored, created = repo.insert(job, active_limit=5, lease_seconds=30)
        assert created and stored.id == job.id and stored.lease_expires_at is not None
        assert repo.get(job.id) == stored
        assert count_active(repo, principal=principal) == 1


def test_a_start_against_a_database_that_never_answers_is_the_stores_retryable_error() -> None:
    """A failed checkout of psycopg's own connection is SQLAlchemy's `OperationalError`, as from
    `engine.connect()`, so `Store` answers the retryable `StoreUnavailable` (nothing stored)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # the kernel completes the handshake; nothing ever answers the startup packet
    port = silent.getsockname()[1]
    repo = JobRepository(f"postgresql+psycopg://postgres@127.0.0.1:{port}/test?connect_timeout=1")
    try:
        with pytest.raises(OperationalError) as caught:
            repo.insert(job_row(_id()), active_limit=5)
        assert not caught.value.connection_invalidated
        with pytest.raises(StoreUnavailable):
            asyncio.run(start_in(Store.of(repo), job_row(_id()), queued=False, active_limit=5))
    finally:
        repo.dispose()
        silent.close()


def test_a_progress_poll_is_one_round_trip_and_reads_what_three_reads_read(repo: JobRepository) -> None:
    job = job_row(_id(), principal=_principal(), lease_owner="node-a", attempts=1)
    repo.insert(job)
    for name, result, error in (
        ("fetch", {"rows": 3, "at": "é"}, None),
        ("bill", None, "refused"),
        ("send", None, None),
    ):
        repo.begin_step(job.id, "node-a", name, 1)
        if name != "send":
            repo.finish_step(job.id, "node-a", name, result=result, error=error)
    repo.open_input(job.id, "node-a", "q2", "Second?", {"type": "object"})
    repo.open_input(
        job.id, "node-a", "q1", "First?", {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    )
    repo.answer_inputs(job.id, {"q2": {"ok": True}})

    stored, pending, steps = repo.snapshot(job.id)
    whole = repo.get(job.id)
    assert whole is not None and stored == JobState.of(whole) and stored.status == "input_required"
    assert pending == repo.pending_inputs(job.id) and [q.key for q in pending] == ["q1"]
    whole_steps = repo.steps(job.id)
    assert steps == [step_state(s) for s in whole_steps] and [s.name for s in steps] == [
        "fetch",
        "bill",
        "send",
    ]
    assert whole_steps[0].result == {"rows": 3, "at": "é"} and whole_steps[1].error == "refused"
    assert all(s.started_at.tzinfo is not None for s in steps) and pending[0].created_at.tzinfo is not None

    trips, sent = round_trips(repo, lambda: repo.snapshot(job.id))
    assert trips == 1, sent

    repo.answer_inputs(job.id, {"q1": {"ok": False}})  # working again: no open questions to read
    stored, pending, steps = repo.snapshot(job.id)
    assert stored is not None and stored.status == "working" and pending == [] and len(steps) == 3
    assert repo.snapshot("no-such-job") == (None, [], [])


def test_json_values_with_nul_travel_apart_from_the_row(repo: JobRepository) -> None:
    """PostgreSQL's JSON functions refuse a document with a \\u0000 escape anywhere in it, while a `json`
    column stores one: a job's arguments, a first question's schema and answer, and a step's result may
    hold NUL, so they travel as `json` parameters of their own, and come back through the snapshot."""
    from sqlalchemy import JSON

    from handles.store.models import _INPUTS, _JOBS
    from handles.store.statements import _INPUT_JSON, _JOB_JSON

    assert set(_JOB_JSON) == {c.name for c in _JOBS.columns if isinstance(c.type, JSON)}
    assert set(_INPUT_JSON) == {c.name for c in _INPUTS.columns if isinstance(c.type, JSON)}

    now = utc_now()
    principal = _principal()
    job = job_row(
        _id(),
        principal=principal,
        idempotency_key="nul",
        arguments={"text": "ok \x00 nul"},
        status="input_required",
    )
    question = InputRequestRecord(
        job_id=job.id,
        key="first",
        message="Go?",
        requested_schema={"title": "a\x00b"},
        created_at=now,
    )
    assert repo.insert(job, active_limit=5, questions=[question])[1]
    stored = repo.get(job.id)
    assert stored is not None and stored.arguments == {"text": "ok \x00 nul"} and stored.result is None
    again, created = repo.insert(job_row(_id(), principal=principal, idempotency_key="nul"), active_limit=5)
    assert not created and again == stored
    _, pending, _ = repo.snapshot(job.id)
    assert [q.requested_schema for q in pending] == [{"title": "a\x00b"}]
    repo.answer_inputs(job.id, {"first": {"note": "x\x00y"}})
    assert [q.answer for q in repo.questions(job.id)] == [{"note": "x\x00y"}]
    claim(repo, job.id, "node-a", 30)
    repo.begin_step(job.id, "node-a", "s", 1)
    repo.finish_step(job.id, "node-a", "s", result={"r": "\x00"})
    assert [s.result for s in repo.steps(job.id)] == [{"r": "\x00"}]
    assert [s.name for s in repo.snapshot(job.id)[2]] == ["s"]


def test_the_hot_reads_on_psycopgs_own_connection_read_what_sqlalchemy_reads_with_the_same_types(
    repo: JobRepository,
) -> None:
    """The reads by key run past SQLAlchemy's statement execution on PostgreSQL: each gives the models
    SQLAlchemy's own execution of the same statement gives, value for value and type for type (floats
    as the server reports them, aware times, JSON), for a job with every kind of column set."""
    from handles.store.models import JobRecord, StepRecord, _one, _rows
    from handles.store.statements import _JOB_BY_ID, _OPEN_QUESTIONS_OF_JOB, _STEPS_OF_JOB, _snapshot_in_one

    job = job_row(
        _id(),
        principal=_principal(),
        lease_owner="node-a",
        attempts=1,
        arguments={"n": 0.1 + 0.2, "text": "é"},
        abandon_after_seconds=90.5,
        keep_result_seconds=3600.25,
    )
    repo.insert(job)
    assert repo.set_progress(job.id, "node-a", 2.5, 10, "a quarter")
    repo.begin_step(job.id, "node-a", "fetch", 1)
    repo.finish_step(job.id, "node-a", "fetch", result={"x": 5e-324})
    repo.open_input(job.id, "node-a", "q1", "First?", {"type": "object"})

    def typed(value: Any) -> Any:
        fields = (
            value
            if isinstance(value, dict)
            else getattr(value, "__dict__", None) or {name: getattr(value, name) for name in value.__slots__}
        )
        return {k: (v, type(v)) for k, v in fields.items() if not k.startswith("_sa_")}

    with repo._fast_reading() as connection:  # SQLAlchemy's own execution
        whole = _one(connection, JobRecord, _JOB_BY_ID, job.id)
        state, pending, steps = _snapshot_in_one(connection, job.id)
        whole_steps = _rows(connection, StepRecord, _STEPS_OF_JOB, job.id)
        questions = _rows(connection, InputRequestRecord, _OPEN_QUESTIONS_OF_JOB, job.id)
    assert whole is not None and state is not None
    assert typed(repo.get(job.id)) == typed(whole) and whole.progress_done == 2.5
    direct = repo.snapshot(job.id)
    assert typed(direct[0]) == typed(state) and direct[2] == steps and len(steps) == 1
    assert [typed(q) for q in direct[1]] == [typed(q) for q in pending]
    assert [typed(s) for s in repo.steps(job.id)] == [typed(s) for s in whole_steps]
    assert [typed(q) for q in repo.pending_inputs(job.id)] == [typed(q) for q in questions] and len(
        questions
    ) == 1
