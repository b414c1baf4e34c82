"""A durable step's two writes (`JobRepository.begin_step`, `finish_step`), on an SQLite file and on PostgreSQL.

They run past the ORM session (issue 14, change 42): statements compiled once in one write transaction on
the driver's own connection, as a job's outcome is written. What they store and refuse is the step
ledger's contract: a step is started once (a completed or unknown one is returned, a failed one started
again, and so is an unknown one that is safe to repeat), its outcome is written once and only while it is started, every change touches its job (a new
version, the time), and only the job's lease holder, while the job is active, writes at all, but for one
write: a run that lost the job records the outcome of the step it started itself, while that start is the
step's last and has no outcome.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text

from handles.errors import LeaseLost
from handles.states import Status
from handles.store import JobRecord, JobRepository, StepRecord, Store
from tests.harness.postgres import repository
from tests.runtime.support import job_row
from tests.store.sqlite_support import statement_threads
from tests.store.support import MovableClock

OWNER = "node-a:1:aaaa"
EXACT = {"sum": 0.1 + 0.2, "tiny": 5e-324, "big": 2**63 + 1, "text": 'é \u2028 " \\ \x01 \U0001f600'}


def _running(repo: JobRepository, owner: str = OWNER) -> JobRecord:
    now = repo.clock()
    stored, created = repo.insert(
        job_row(
            f"s-{secrets.token_hex(6)}",
            lease_owner=owner,
            lease_expires_at=now + timedelta(hours=1),
            attempts=1,
            started_at=now,
            created_at=now,
            updated_at=now,
        )
    )
    assert created
    return stored


def _version(repo: JobRepository, job_id: str) -> tuple[int, datetime]:
    job = repo.get(job_id)
    assert job is not None
    return job.version, job.updated_at


def _ledger(repo: JobRepository, job_id: str) -> dict[str, dict[str, Any]]:
    return {step.name: step.model_dump() for step in repo.steps(job_id)}


def _step(job_id: str, name: str, **values: Any) -> dict[str, Any]:
    return StepRecord(job_id=job_id, name=name, **values).model_dump()


def test_a_step_is_recorded_started_then_with_its_outcome_each_write_touching_its_job(
    repo: JobRepository, clock: MovableClock
) -> None:
    job = _running(repo)
    started_at = clock.now + timedelta(seconds=1)
    clock.advance(1)
    record, fresh = repo.begin_step(job.id, OWNER, "fetch «rows»", 1)
    assert fresh
    started = _step(job.id, "fetch «rows»", status="started", attempt=1, started_at=started_at)
    assert record.model_dump() == started
    assert _ledger(repo, job.id) == {"fetch «rows»": started}
    assert _version(repo, job.id) == (job.version + 1, started_at)

    clock.advance(2)
    repo.finish_step(job.id, OWNER, "fetch «rows»", result=EXACT)
    completed = started | {"status": "completed", "result": EXACT, "finished_at": clock.now}
    assert _ledger(repo, job.id) == {"fetch «rows»": completed}
    assert _version(repo, job.id) == (job.version + 2, clock.now)

    repo.begin_step(job.id, OWNER, "charge", 1)
    clock.advance(1)
    repo.finish_step(job.id, OWNER, "charge", error="CardDeclined: refused")
    charge = _ledger(repo, job.id)["charge"]
    assert (charge["status"], charge["error"], charge["result"], charge["finished_at"]) == (
        "failed",
        "CardDeclined: refused",
        None,
        clock.now,
    )
    assert _version(repo, job.id) == (job.version + 4, clock.now)


def test_a_known_step_is_returned_as_stored_and_a_failed_one_is_started_afresh(
    repo: JobRepository, clock: MovableClock
) -> None:
    job = _running(repo)
    repo.begin_step(job.id, OWNER, "done", 1)
    repo.finish_step(job.id, OWNER, "done", result=EXACT)
    repo.begin_step(job.id, OWNER, "unknown", 1)  # started, its outcome never recorded
    repo.begin_step(job.id, OWNER, "refused", 1)
    repo.finish_step(job.id, OWNER, "refused", error="Timeout: the service did not answer")
    before, version = _ledger(repo, job.id), _version(repo, job.id)

    clock.advance(5)
    for name in ("done", "unknown"):
        record, fresh = repo.begin_step(job.id, OWNER, name, 2)
        assert not fresh
        assert record.model_dump() == before[name]
    assert _ledger(repo, job.id) == before and _version(repo, job.id) == version  # nothing written

    record, fresh = repo.begin_step(job.id, OWNER, "refused", 2)
    again = _step(job.id, "refused", status="started", attempt=2, started_at=clock.now)
    assert fresh and record.model_dump() == again
    assert _ledger(repo, job.id) == before | {"refused": again}
    assert _version(repo, job.id) == (version[0] + 1, clock.now)


def test_a_repeatable_step_without_an_outcome_is_started_afresh_and_a_completed_one_is_not(
    repo: JobRepository, clock: MovableClock
) -> None:
    job = _running(repo)
    repo.begin_step(job.id, OWNER, "build", 1, repeatable=True)  # started, its outcome never recorded
    repo.begin_step(job.id, OWNER, "test", 1, repeatable=True)
    repo.finish_step(job.id, OWNER, "test", result={"passed": 12})
    before, version = _ledger(repo, job.id), _version(repo, job.id)

    clock.advance(5)
    record, fresh = repo.begin_step(job.id, OWNER, "test", 2, repeatable=True)
    assert not fresh and record.model_dump() == before["test"], "a completed step is replayed, never rerun"
    assert _version(repo, job.id) == version
    record, fresh = repo.begin_step(job.id, OWNER, "build", 2, repeatable=True)
    again = _step(job.id, "build", status="started", attempt=2, started_at=clock.now)
    assert fresh and record.model_dump() == again
    assert _ledger(repo, job.id) == before | {"build": again}
    assert _version(repo, job.id) == (version[0] + 1, clock.now)
    with pytest.raises(LeaseLost):  # the first run, which lost the job, finishing its own start late
        repo.finish_step(job.id, "node-b:2:bbbb", "build", result="built", attempt=1)
    assert _ledger(repo, job.id)["build"] == again, "only the run that started it last records its outcome"


def test_finishing_a_step_that_is_not_started_changes_nothing(
    repo: JobRepository, clock: MovableClock
) -> None:
    job = _running(repo)
    repo.begin_step(job.id, OWNER, "done", 1)
    repo.finish_step(job.id, OWNER, "done", result={"n": 1})
    before, version = _ledger(repo, job.id), _version(repo, job.id)
    clock.advance(1)
    repo.finish_step(job.id, OWNER, "done", error="late")  # completed already
    repo.finish_step(job.id, OWNER, "never begun", result={"n": 2})
    assert _ledger(repo, job.id) == before and _version(repo, job.id) == version


@pytest.mark.parametrize("case", ["another owner", "ended", "unknown job"])
def test_a_step_write_by_anyone_but_the_active_jobs_lease_holder_is_refused_and_changes_nothing(
    repo: JobRepository, case: str
) -> None:
    job = _running(repo)
    repo.begin_step(job.id, OWNER, "open", 1)
    job_id, owner = job.id, OWNER
    if case == "another owner":
        owner = "node-b:2:bbbb"
    elif case == "ended":
        assert repo.transition(job.id, Status.CANCELLED, owner=OWNER)
    else:
        job_id = "s-no-such-job"
    before, stored = _ledger(repo, job.id), repo.get(job.id)
    with pytest.raises(LeaseLost):
        repo.begin_step(job_id, owner, "new", 1)
    with pytest.raises(LeaseLost):
        repo.finish_step(job_id, owner, "open", result="forged")
    assert _ledger(repo, job.id) == before
    assert repo.get(job.id) == stored
    assert repo.steps("s-no-such-job") == []


@pytest.mark.parametrize("lost", ["recovered elsewhere", "ended"])
def test_a_run_that_lost_its_job_records_its_own_started_steps_outcome_and_nothing_else(
    repo: JobRepository, clock: MovableClock, lost: str
) -> None:
    """A run whose lease moved while its step ran (its node stood still past the lease, and a sweep gave the
    job to a retry) or whose job ended meanwhile: the outcome of the step this run started, still started
    with its attempt, is recorded, since only this run knows it and nobody else has decided it; the write
    then raises `LeaseLost`. A step it did not start, one with an outcome, and an outcome given without its
    attempt are refused and change nothing."""
    job = _running(repo)
    repo.begin_step(job.id, OWNER, "charge", 1)
    repo.begin_step(job.id, OWNER, "upload", 1)
    repo.begin_step(job.id, OWNER, "done", 1)
    repo.finish_step(job.id, OWNER, "done", result=1, attempt=1)
    if lost == "recovered elsewhere":
        with repo.engine.begin() as connection:
            connection.execute(
                text("update handles_jobs set lease_owner = 'node-b:2:bbbb', attempts = 2 where id = :id"),
                {"id": job.id},
            )
        repo.begin_step(job.id, "node-b:2:bbbb", "ship", 2)  # the new run's own step
    else:
        assert repo.transition(job.id, Status.CANCELLED, owner=OWNER)
    before, version = _ledger(repo, job.id), _version(repo, job.id)
    clock.advance(1)
    for name, attempt in (("ship", 1), ("done", 1), ("charge", None), ("charge", 2)):
        with pytest.raises(LeaseLost):
            repo.finish_step(job.id, OWNER, name, result="refused", attempt=attempt)
    assert _ledger(repo, job.id) == before and _version(repo, job.id) == version

    with pytest.raises(LeaseLost):
        repo.finish_step(job.id, OWNER, "charge", result={"receipt": "r-1"}, attempt=1)
    receipt = {"status": "completed", "result": {"receipt": "r-1"}, "finished_at": clock.now}
    assert _ledger(repo, job.id) == before | {"charge": before["charge"] | receipt}
    assert _version(repo, job.id) == (version[0] + 1, clock.now)
    with pytest.raises(LeaseLost):
        repo.finish_step(job.id, OWNER, "upload", error="OSError: disk full", attempt=1)
    refused = {"status": "failed", "error": "OSError: disk full", "finished_at": clock.now}
    assert _ledger(repo, job.id)["upload"] == before["upload"] | refused

    written = _ledger(repo, job.id)
    with pytest.raises(LeaseLost):  # recorded once: the step is no longer started
        repo.finish_step(job.id, OWNER, "charge", result={"receipt": "r-2"}, attempt=1)
    assert _ledger(repo, job.id) == written


def test_a_kept_outcome_of_a_run_that_lost_its_job_wakes_the_jobs_waiters(repo: JobRepository) -> None:
    """The write that keeps it raises `LeaseLost` after it committed: the job's waiters of every change (a
    progress long-poll) are woken all the same, on the SQLite file's inline write as on a worker thread."""
    job = _running(repo)
    repo.begin_step(job.id, OWNER, "charge", 1)
    assert repo.transition(job.id, Status.CANCELLED, owner=OWNER)

    async def main() -> None:
        store = Store.of(repo)
        changed = store.notifier.watch(job.id)
        with pytest.raises(LeaseLost):
            await store.write(
                job.id, "reported", repo.finish_step, job.id, OWNER, "charge", result=1, attempt=1
            )
        assert changed.is_set()

    asyncio.run(main())
    assert _ledger(repo, job.id)["charge"]["status"] == "completed"


def test_a_step_write_the_database_refuses_is_rolled_back_and_the_next_one_is_stored(
    repo: JobRepository, database_url: str
) -> None:
    """A step's result that is not JSON fails in the write transaction, after the lease was read (and on
    PostgreSQL locked): nothing is stored, the job is not touched, and the same connection pool serves the
    next write, which finds the row unlocked."""
    write_pids: set[int] = set()  # the backends this test's writes ran on (other tests share the server)
    if database_url.startswith("postgresql"):
        event.listen(
            repo.engine,
            "checkout",
            lambda connection, record, proxy: write_pids.add(connection.info.backend_pid),
        )
    job = _running(repo)
    repo.begin_step(job.id, OWNER, "fetch", 1)
    before, stored = _ledger(repo, job.id), repo.get(job.id)
    with pytest.raises(TypeError):
        repo.finish_step(job.id, OWNER, "fetch", result={"not json": object()})
    assert _ledger(repo, job.id) == before and repo.get(job.id) == stored
    repo.finish_step(job.id, OWNER, "fetch", result=[1, 2])
    assert _ledger(repo, job.id)["fetch"]["result"] == [1, 2]
    if database_url.startswith("postgresql"):  # no transaction left open on the write connection
        with repo.engine.connect() as connection:
            busy = connection.execute(
                text(
                    "select count(*) from pg_stat_activity"
                    " where state = 'idle in transaction' and pid = any(:pids) and pid <> pg_backend_pid()"
                ),
                {"pids": sorted(write_pids)},
            ).scalar_one()
        assert write_pids and busy == 0


def test_concurrent_outcomes_of_one_step_leave_exactly_one(repo: JobRepository) -> None:
    """Two writers of the same step's outcome at once (a retry racing the first try): one wins, the other
    finds it no longer started, and the job is touched once for it."""
    job = _running(repo)
    repo.begin_step(job.id, OWNER, "fetch", 1)
    version = _version(repo, job.id)[0]
    barrier = threading.Barrier(2)

    def finish(value: int) -> None:
        barrier.wait(timeout=10)
        repo.finish_step(job.id, OWNER, "fetch", result={"try": value})

    threads = [threading.Thread(target=finish, args=(value,)) for value in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    step = _ledger(repo, job.id)["fetch"]
    assert step["status"] == "completed" and step["result"] in ({"try": 1}, {"try": 2})
    assert _version(repo, job.id)[0] == version + 1


def test_concurrent_starts_of_one_step_start_it_once(repo: JobRepository) -> None:
    """Two starts of the same step at once (a job that gave two steps one name): one starts it, the other
    gets it as known and started. On PostgreSQL the second waits for the job's lock, with a snapshot taken
    before the first committed."""
    job = _running(repo)
    for trial in range(10):
        name = f"fetch {trial}"
        barrier = threading.Barrier(2)
        results: list[tuple[StepRecord, bool]] = []

        def begin(
            name: str = name, barrier: threading.Barrier = barrier, results: list[Any] = results
        ) -> None:
            barrier.wait(timeout=10)
            results.append(repo.begin_step(job.id, OWNER, name, 1))

        threads = [threading.Thread(target=begin) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert sorted(fresh for _, fresh in results) == [False, True]
        assert {(record.name, record.status) for record, _ in results} == {(name, "started")}
    assert _version(repo, job.id)[0] == job.version + 10


def test_a_steps_writes_on_an_sqlite_file_run_on_the_event_loop_and_wake_its_waiters(
    sqlite_repo: JobRepository, sqlite_path: Path
) -> None:
    """As a job's outcome: `Store.write` (`reported`) runs them on the event loop when the writer lock is free (no
    worker-thread hop for either of a step's writes), committed before it returns. They wake the job's
    waiters of every change, not those past its reports (a fetch)."""
    job = _running(sqlite_repo)
    threads = statement_threads(sqlite_repo, "UPDATE handles_jobs")  # each write touches the job

    async def main() -> None:
        store = Store.of(sqlite_repo)
        changed, fetching = store.notifier.watch(job.id), store.notifier.watch(job.id, past_reports=True)
        record, fresh = await store.write(
            job.id, "reported", sqlite_repo.begin_step, job.id, OWNER, "fetch", 1
        )
        assert fresh and record.status == "started" and changed.is_set()
        changed = store.notifier.watch(job.id)
        await store.write(job.id, "reported", sqlite_repo.finish_step, job.id, OWNER, "fetch", result=EXACT)
        assert changed.is_set() and not fetching.is_set()

    asyncio.run(main())
    assert len(threads) == 2 and set(threads) == {threading.get_ident()}, "both written on the loop's thread"
    with repository(f"sqlite:///{sqlite_path.as_posix()}") as other:  # what is on disk, committed
        assert [(s.status, s.result) for s in other.steps(job.id)] == [("completed", EXACT)]


def test_a_start_tried_again_with_its_own_time_finds_its_committed_try_fresh(
    repo: JobRepository, clock: MovableClock
) -> None:
    """A start whose commit succeeded but whose answer was lost (an outage) is tried again with the same start
    time: it finds its own start and answers fresh, while any other start of the step finds it unknown."""
    job = _running(repo)
    began = clock.now
    first, fresh = repo.begin_step(job.id, OWNER, "deploy", 1, started_at=began)
    assert fresh
    ledger, version = _ledger(repo, job.id), _version(repo, job.id)
    clock.advance(1)
    again, fresh = repo.begin_step(job.id, OWNER, "deploy", 1, started_at=began)
    assert fresh and again.model_dump() == first.model_dump()
    assert _ledger(repo, job.id) == ledger and _version(repo, job.id) == version  # nothing written twice
    for attempt, at in ((1, clock.now), (2, began)):
        other, fresh = repo.begin_step(job.id, OWNER, "deploy", attempt, started_at=at)
        assert not fresh and other.model_dump() == first.model_dump()
