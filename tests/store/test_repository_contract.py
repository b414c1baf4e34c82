"""The store contract of `JobRepository`, run on an SQLite file and on PostgreSQL (`database_url` fixture).

Every status change is a compare-and-set through the transition table: racing
writers have exactly one winner, terminal states never change, and a claim is
exclusive. Races use real threads on separate connections, released together by a
barrier, many times over.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any, TypeVar

import pytest

from handles.errors import LeaseLost
from handles.handle import new_job_id
from handles.principal import principal_match, token_form
from handles.states import ACTIVE, TERMINAL, Status, can_transition
from handles.store import JobRecord, JobRepository, JobState, StepState
from handles.store.models import claims_of
from tests.store.support import MovableClock
from tests.support import claim, count_active, get_input, step_state

T = TypeVar("T")
TRIALS = 30
OWNER, OTHER_OWNER = "node-a:1:aaaa", "node-b:2:bbbb"
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=4) as executor:
        yield executor


def race(pool: ThreadPoolExecutor, *calls: Callable[[], Any]) -> list[Any]:
    """Run `calls` on separate threads, released at the same instant; their results in order."""
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], T]) -> T:
        barrier.wait(timeout=10)
        return call()

    futures = [pool.submit(run, call) for call in calls]
    return [future.result(timeout=60) for future in futures]


def new_job(
    repo: JobRepository,
    *,
    status: Status = Status.WORKING,
    principal: str = "local:alice",
    kind: str = "report",
    key: str | None = None,
    arguments: dict[str, Any] | None = None,
    run_after: datetime | None = None,
    retention: float = 3600,
    insert: bool = True,
) -> JobRecord:
    now = repo.clock()
    job = JobRecord(
        id=new_job_id(),
        kind=kind,
        principal=principal,
        status=status.value,
        status_message="Queued.",
        arguments=arguments if arguments is not None else {"account": "acme", "months": 3},
        arguments_digest="digest",
        idempotency_key=key,
        created_at=now,
        updated_at=now,
        run_after=run_after or now,
        expires_at=now + timedelta(seconds=retention),
    )
    if insert:
        stored, created = repo.insert(job)
        assert created
        return stored
    return job


def claimed_job(repo: JobRepository, owner: str = OWNER, **options: Any) -> JobRecord:
    job = new_job(repo, **options)
    record = claim(repo, job.id, owner, 30)
    assert record is not None
    return record


def snapshot(repo: JobRepository, job_id: str) -> dict[str, Any]:
    record = repo.get(job_id)
    assert record is not None
    return record.model_dump()


def reach(repo: JobRepository, status: Status) -> JobRecord:
    """A job that got to `status` along the runtime's own path (claimed, then moved by its owner)."""
    job = claimed_job(repo)
    if status is Status.WORKING:
        return job
    if status is Status.INPUT_REQUIRED:
        repo.open_input(job.id, OWNER, "q1", "Proceed?", SCHEMA)
    else:
        values: dict[str, Any] = {"status_message": f"{status.value}."}
        if status is Status.COMPLETED:
            values["result"] = {"content": [{"type": "text", "text": "{}"}], "structuredContent": {}}
        if status is Status.FAILED:
            values["error"] = {"code": -32603, "message": "boom"}
        assert repo.transition(job.id, status, owner=OWNER, **values)
    record = repo.get(job.id)
    assert record is not None and record.status == status.value
    return record


# -- basics --------------------------------------------------------------------------------


def test_insert_and_get_round_trip(repo: JobRepository) -> None:
    job = new_job(repo, arguments={"account": "ünïcode", "nested": {"list": [1, 2.5, None, True]}})
    stored = repo.get(job.id)
    assert stored is not None
    assert stored.arguments == {"account": "ünïcode", "nested": {"list": [1, 2.5, None, True]}}
    assert stored.status == "working" and stored.version == 0 and stored.attempts == 0
    for name in ("created_at", "updated_at", "run_after", "expires_at"):
        value = getattr(stored, name)
        assert value.tzinfo is not None and value.utcoffset() == timedelta(0), name
        assert value == getattr(job, name), name
    assert repo.get("no-such-job") is None


def test_naive_datetimes_are_refused(repo: JobRepository) -> None:
    job = new_job(repo, insert=False)
    job.created_at = datetime(2030, 1, 1)  # no tzinfo
    with pytest.raises(Exception, match="naive datetime"):
        repo.insert(job)
    assert repo.get(job.id) is None


def test_idempotency_key_returns_the_first_job(repo: JobRepository) -> None:
    first = new_job(repo, key="k-1")
    again, created = repo.insert(new_job(repo, key="k-1", arguments={"other": True}, insert=False))
    assert not created and again.id == first.id and again.arguments == first.arguments
    # The key is scoped to (principal, kind); no key never collides.
    assert repo.insert(new_job(repo, key="k-1", principal="local:bob", insert=False))[1]
    assert repo.insert(new_job(repo, key="k-1", kind="export", insert=False))[1]
    assert repo.insert(new_job(repo, insert=False))[1]
    assert repo.insert(new_job(repo, insert=False))[1]


def test_concurrent_starts_with_one_idempotency_key_store_one_job(
    repo: JobRepository, pool: ThreadPoolExecutor
) -> None:
    for trial in range(TRIALS // 3):
        candidates = [new_job(repo, key=f"race-{trial}", insert=False) for _ in range(3)]
        results = race(pool, *[lambda job=job: repo.insert(job) for job in candidates])
        assert sorted(created for _, created in results) == [False, False, True]
        assert len({job.id for job, _ in results}) == 1


# -- the transition table, enforced by the store -------------------------------------------------


@pytest.mark.parametrize("source", list(Status))
def test_transition_follows_the_table(repo: JobRepository, source: Status) -> None:
    for target in Status:
        job = new_job(repo, status=source)
        before = snapshot(repo, job.id)
        changed = repo.transition(job.id, target)
        assert changed is can_transition(source, target), (source, target)
        after = snapshot(repo, job.id)
        if changed:
            assert after["status"] == target.value
            assert after["version"] == before["version"] + 1
            assert (after["finished_at"] is not None) is target.is_terminal
        else:
            assert after == before, "a refused transition writes nothing"
    assert repo.transition("no-such-job", Status.CANCELLED) is False


def test_transition_checks_the_lease_owner(repo: JobRepository) -> None:
    job = claimed_job(repo)
    assert not repo.transition(job.id, Status.COMPLETED, owner=OTHER_OWNER)
    assert repo.transition(job.id, Status.COMPLETED, owner=OWNER, result={"content": []})
    done = repo.get(job.id)
    assert done is not None
    assert done.lease_owner is None and done.lease_expires_at is None and done.finished_at is not None
    assert done.result == {"content": []}


@pytest.mark.parametrize("terminal", sorted(TERMINAL))
def test_terminal_states_never_change(repo: JobRepository, clock: MovableClock, terminal: Status) -> None:
    job = reach(repo, terminal)
    before = snapshot(repo, job.id)
    clock.advance(3600 * 24 * 365)  # leases long gone, run_after long past
    for target in Status:
        assert not repo.transition(job.id, target)
        assert not repo.transition(job.id, target, owner=OWNER)
        assert not repo.transition(job.id, target, lease_expired=True)
    outcome = repo.request_cancel(job.id)
    assert outcome is not None and not outcome.ended_now and outcome.job.status == terminal.value
    assert claim(repo, job.id, OTHER_OWNER, 30) is None
    assert not repo.set_progress(job.id, OWNER, 1, 2, "late")
    assert not repo.release(job.id, OWNER, run_after=clock(), message="again")
    answered = repo.answer_inputs(job.id, {"q1": {"ok": True}})
    assert answered is not None and answered.accepted == []
    with pytest.raises(LeaseLost):
        repo.open_input(job.id, OWNER, "q9", "Again?", SCHEMA)
    assert repo.heartbeat(OWNER, [job.id], 30) == (set(), {job.id})
    assert repo.expired_leases(10) == []
    assert snapshot(repo, job.id) == before


# -- races: exactly one winner ----------------------------------------------------------------


def test_cancel_racing_completion_has_exactly_one_winner(
    repo: JobRepository, pool: ThreadPoolExecutor
) -> None:
    winners = {Status.COMPLETED: 0, Status.CANCELLED: 0}
    for _ in range(TRIALS):
        job = claimed_job(repo)
        completed, cancelled = race(
            pool,
            lambda job=job: repo.transition(job.id, Status.COMPLETED, owner=OWNER, result={"content": []}),
            lambda job=job: repo.transition(job.id, Status.CANCELLED, owner=OWNER),
        )
        assert completed != cancelled, "exactly one of the two writers wins"
        final = repo.get(job.id)
        assert final is not None
        winner = Status.COMPLETED if completed else Status.CANCELLED
        assert final.status == winner.value
        assert (final.result is not None) is completed
        assert final.version == job.version + 1, "one change, not two"
        winners[winner] += 1
    assert sum(winners.values()) == TRIALS


def test_racing_terminal_writers_have_exactly_one_winner(
    repo: JobRepository, pool: ThreadPoolExecutor
) -> None:
    for _ in range(TRIALS // 2):
        job = claimed_job(repo)
        targets = [Status.COMPLETED, Status.FAILED, Status.CANCELLED, Status.COMPLETED]
        results = race(pool, *[lambda job=job, t=t: repo.transition(job.id, t) for t in targets])
        assert results.count(True) == 1
        final = repo.get(job.id)
        assert final is not None and final.status == targets[results.index(True)].value


def test_cancel_request_racing_claim_has_exactly_one_winner(
    repo: JobRepository, pool: ThreadPoolExecutor
) -> None:
    for _ in range(TRIALS):
        job = new_job(repo)
        claimed, cancel = race(
            pool,
            lambda job=job: claim(repo, job.id, OWNER, 30),
            lambda job=job: repo.request_cancel(job.id),
        )
        assert cancel is not None
        assert (claimed is not None) != cancel.ended_now, "either the claim or the cancel wins, never both"
        final = repo.get(job.id)
        assert final is not None and final.cancel_requested_at is not None
        if claimed is not None:
            # The runtime holds it and will be told to stop; it is not ended under its feet.
            assert final.status == "working" and final.lease_owner == OWNER
        else:
            assert final.status == "cancelled" and final.lease_owner is None


def test_an_answer_racing_a_cancel_never_revives_the_job(
    repo: JobRepository, pool: ThreadPoolExecutor
) -> None:
    for _ in range(TRIALS):
        job = reach(repo, Status.INPUT_REQUIRED)
        answered, cancelled = race(
            pool,
            lambda job=job: repo.answer_inputs(job.id, {"q1": {"ok": True}}),
            lambda job=job: repo.transition(job.id, Status.CANCELLED),
        )
        assert cancelled is True, "working and input_required can both be cancelled"
        final = repo.get(job.id)
        assert final is not None and final.status == "cancelled", "a terminal state never changes back"
        assert answered is not None


def test_claim_is_exclusive(repo: JobRepository, pool: ThreadPoolExecutor) -> None:
    owners = [f"node-{n}" for n in range(4)]
    for _ in range(TRIALS):
        job = new_job(repo)
        results = race(pool, *[lambda job=job, o=o: claim(repo, job.id, o, 30) for o in owners])
        winners = [record for record in results if record is not None]
        assert len(winners) == 1
        final = repo.get(job.id)
        assert final is not None
        assert final.lease_owner == winners[0].lease_owner and final.attempts == 1


# -- claims, leases, heartbeats ---------------------------------------------------------------


def test_claim_takes_only_a_queued_job_that_may_start(repo: JobRepository, clock: MovableClock) -> None:
    later = new_job(repo, run_after=clock() + timedelta(seconds=60))
    assert claim(repo, later.id, OWNER, 30) is None
    clock.advance(60)
    record = claim(repo, later.id, OWNER, 30)
    assert record is not None
    assert record.lease_owner == OWNER and record.attempts == 1 and record.started_at == clock()
    assert record.lease_expires_at == clock() + timedelta(seconds=30)
    assert claim(repo, later.id, OTHER_OWNER, 30) is None, "held"

    cancelled_first = new_job(repo)
    repo.request_cancel(cancelled_first.id)
    assert claim(repo, cancelled_first.id, OWNER, 30) is None
    assert claim(repo, "no-such-job", OWNER, 30) is None


def test_claim_next_takes_startable_jobs_oldest_first(repo: JobRepository, clock: MovableClock) -> None:
    older = new_job(repo, run_after=clock() - timedelta(seconds=20))
    newer = new_job(repo, run_after=clock() - timedelta(seconds=10))
    new_job(repo, run_after=clock() + timedelta(seconds=10))  # not yet
    new_job(repo, kind="export")  # another kind
    claimed_job(repo)  # running
    reach(repo, Status.COMPLETED)
    assert repo.claim_next(OWNER, [], 10, 30) == [] and repo.claim_next(OWNER, ["report"], 0, 30) == []
    assert [job.id for job in repo.claim_next(OWNER, ["report"], 1, 30)] == [older.id]
    assert [job.id for job in repo.claim_next(OWNER, ["report"], 10, 30)] == [newer.id]
    assert repo.claim_next(OWNER, ["report"], 10, 30) == []


def test_has_claimable_sees_exactly_what_claim_next_would_take(
    repo: JobRepository, clock: MovableClock
) -> None:
    """The dispatcher's look before it reserves slots: no false "nothing waits" (a job would sit until the
    next start), and no false "something waits" for jobs no claim may take."""
    assert not repo.has_claimable(["report"]) and not repo.has_claimable([])
    later = new_job(repo, run_after=clock() + timedelta(seconds=10))  # not yet due
    new_job(repo, kind="export")  # another kind
    claimed_job(repo)  # running
    reach(repo, Status.COMPLETED)
    repo.request_cancel(new_job(repo).id)  # cancelled before it ran
    assert not repo.has_claimable(["report"])
    assert repo.has_claimable(["report", "export"])
    clock.advance(10)
    assert repo.has_claimable(["report"])
    assert [job.id for job in repo.claim_next(OWNER, ["report"], 10, 30)] == [later.id]
    assert not repo.has_claimable(["report"])


def test_heartbeat_extends_leases_and_reports_cancels_and_losses(
    repo: JobRepository, clock: MovableClock
) -> None:
    mine = claimed_job(repo)
    cancelled = claimed_job(repo)
    theirs = claimed_job(repo, owner=OTHER_OWNER)
    ended = reach(repo, Status.COMPLETED)
    repo.request_cancel(cancelled.id)
    clock.advance(20)
    asked, lost = repo.heartbeat(OWNER, [mine.id, cancelled.id, theirs.id, ended.id, "gone"], 30)
    assert asked == {cancelled.id}
    assert lost == {theirs.id, ended.id, "gone"}
    record = repo.get(mine.id)
    assert record is not None and record.lease_expires_at == clock() + timedelta(seconds=30)
    other = repo.get(theirs.id)
    assert other is not None and other.lease_expires_at == theirs.lease_expires_at, "not mine to renew"


def test_recovery_waits_for_the_lease_to_run_out(repo: JobRepository, clock: MovableClock) -> None:
    job = claimed_job(repo)
    assert repo.expired_leases(10) == []
    assert not repo.transition(job.id, Status.FAILED, owner=OWNER, lease_expired=True)
    assert not repo.release(job.id, OWNER, run_after=clock(), message="retry", lease_expired=True)
    clock.advance(31)
    assert [r.id for r in repo.expired_leases(10)] == [job.id]
    assert repo.release(
        job.id, OWNER, run_after=clock() + timedelta(seconds=5), message="retry", lease_expired=True
    )
    requeued = repo.get(job.id)
    assert requeued is not None
    assert (
        requeued.status == "working" and requeued.lease_owner is None and requeued.status_message == "retry"
    )
    assert repo.claim_next(OTHER_OWNER, ["report"], 10, 30) == [], "not before its retry delay"
    clock.advance(5)
    [again] = repo.claim_next(OTHER_OWNER, ["report"], 10, 30)
    assert again.id == job.id and again.attempts == 2
    clock.advance(31)
    assert repo.transition(job.id, Status.FAILED, owner=OTHER_OWNER, lease_expired=True)


def test_progress_is_written_only_by_the_lease_holder_of_an_active_job(repo: JobRepository) -> None:
    job = claimed_job(repo)
    assert not repo.set_progress(job.id, OTHER_OWNER, 1, 4, "not mine")
    assert repo.set_progress(job.id, OWNER, 1, 4, "a quarter")
    record = repo.get(job.id)
    assert record is not None
    assert (record.progress_done, record.progress_total, record.status_message) == (1, 4, "a quarter")
    assert record.version == job.version + 1


@pytest.mark.parametrize("status", list(Status))
def test_the_snapshot_holds_the_state_of_the_stored_row(repo: JobRepository, status: Status) -> None:
    """`snapshot` reads only the columns a follower is shown: each holds what the whole row holds, with the
    same types (aware UTC times, JSON as dicts, floats), in every status."""
    job = reach(repo, status)
    if status is Status.WORKING:
        assert repo.set_progress(job.id, OWNER, 2.5, 10, "a quarter")
    whole = repo.get(job.id)
    assert whole is not None
    state, pending, steps = repo.snapshot(job.id)
    assert state == JobState.of(whole)
    assert {name: type(getattr(state, name)) for name in ("created_at", "expires_at", "version")} == {
        "created_at": datetime,
        "expires_at": datetime,
        "version": int,
    }
    assert state is not None and state.created_at.utcoffset() == timedelta(0)
    if status is Status.WORKING:
        assert (state.progress_done, state.progress_total, state.status_message) == (2.5, 10, "a quarter")
    if status is Status.FAILED:
        assert state.error == {"code": -32603, "message": "boom"}
    assert [q.key for q in pending] == (["q1"] if status is Status.INPUT_REQUIRED else [])
    assert steps == []
    assert repo.snapshot("no-such-job") == (None, [], [])


def test_the_snapshot_holds_each_steps_state_in_the_order_they_started(
    repo: JobRepository, clock: MovableClock
) -> None:
    """A poll shows each step's name, status, attempt and times as the step's whole row holds them (aware
    UTC, to the microsecond), in the order the steps started, by name where two started at once; a
    step's result, which may be large, is not part of it and stays stored as it was written."""
    job = claimed_job(repo)
    exact = {"sum": 0.1 + 0.2, "tiny": 5e-324, "big": 2**63 + 1, "text": 'é \u2028 " \\ \x01 \U0001f600'}
    large = {"rows": list(range(20_000))}
    clock.advance(0.000001)
    repo.begin_step(job.id, OWNER, "zeta", 1)
    repo.finish_step(job.id, OWNER, "zeta", result=exact)
    clock.advance(1.5)
    for name in ("beta 'quoted' \"name\" é", "alpha"):  # two steps started at the same instant
        repo.begin_step(job.id, OWNER, name, 2)
    repo.finish_step(job.id, OWNER, "alpha", result=large)
    repo.finish_step(job.id, OWNER, "beta 'quoted' \"name\" é", error="refused")
    clock.advance(0.25)
    repo.begin_step(job.id, OWNER, "open", 3)  # still running

    state, pending, steps = repo.snapshot(job.id)
    whole = {step.name: step for step in repo.steps(job.id)}
    assert state is not None and pending == []
    assert [step.name for step in steps] == ["zeta", "alpha", "beta 'quoted' \"name\" é", "open"]
    assert steps == [step_state(whole[step.name]) for step in steps]
    assert all(type(step) is StepState for step in steps)
    assert steps[0].started_at == clock.now - timedelta(seconds=1.75) and steps[0].started_at.microsecond == 1
    assert all(step.started_at.utcoffset() == timedelta(0) for step in steps)
    assert [step.finished_at is None for step in steps] == [False, False, False, True]
    assert [(step.status, step.attempt) for step in steps] == [
        ("completed", 1),
        ("completed", 2),
        ("failed", 2),
        ("started", 3),
    ]
    assert whole["zeta"].result == exact and whole["alpha"].result == large


# -- cancellation ---------------------------------------------------------------------------------


def test_cancelling_a_queued_job_ends_it_at_once(repo: JobRepository, clock: MovableClock) -> None:
    job = new_job(repo)
    outcome = repo.request_cancel(job.id)
    assert outcome is not None and outcome.ended_now
    record = repo.get(job.id)
    assert record is not None
    assert (
        record.status == "cancelled"
        and record.finished_at == clock()
        and record.cancel_requested_at == clock()
    )
    assert repo.request_cancel("no-such-job") is None


def test_cancelling_a_running_job_only_records_the_request(repo: JobRepository, clock: MovableClock) -> None:
    job = claimed_job(repo)
    first = repo.request_cancel(job.id)
    assert first is not None and not first.ended_now and first.job.status == "working"
    requested_at = first.job.cancel_requested_at
    clock.advance(5)
    second = repo.request_cancel(job.id)
    assert second is not None and second.job.cancel_requested_at == requested_at, "the first request stands"
    assert repo.transition(job.id, Status.CANCELLED, owner=OWNER)


# -- questions and answers -----------------------------------------------------------------------


def test_questions_park_the_job_until_every_one_is_answered(repo: JobRepository) -> None:
    job = claimed_job(repo)
    with pytest.raises(LeaseLost):
        repo.open_input(job.id, OTHER_OWNER, "q1", "Not mine", SCHEMA)
    assert repo.open_input(job.id, OWNER, "q1", "First?", SCHEMA) is None
    assert repo.open_input(job.id, OWNER, "q2", "Second?", SCHEMA) is None
    record = repo.get(job.id)
    assert record is not None and record.status == "input_required" and record.status_message == "Second?"
    pending = repo.pending_inputs(job.id)
    assert [(p.key, p.message, p.requested_schema) for p in pending] == [
        ("q1", "First?", SCHEMA),
        ("q2", "Second?", SCHEMA),
    ]

    partial = repo.answer_inputs(job.id, {"q1": {"ok": True}, "q7": {"ok": False}})
    assert partial is not None and partial.accepted == ["q1"] and partial.ignored == ["q7"]
    assert partial.job.status == "input_required", "q2 still waits"
    assert [p.key for p in repo.pending_inputs(job.id)] == ["q2"]

    again = repo.answer_inputs(job.id, {"q1": {"ok": False}})
    assert again is not None and again.accepted == [] and again.ignored == ["q1"], "already answered"
    stored = get_input(repo, job.id, "q1")
    assert stored is not None and stored.answer == {"ok": True} and stored.answered_at is not None

    final = repo.answer_inputs(job.id, {"q2": {"ok": False}})
    assert final is not None and final.accepted == ["q2"] and final.job.status == "working"
    assert repo.pending_inputs(job.id) == []
    replay = repo.open_input(job.id, OWNER, "q1", "First?", SCHEMA)
    assert replay is not None and replay.answer == {"ok": True}, "a retried job gets the recorded answer back"
    assert repo.answer_inputs("no-such-job", {"q1": {}}) is None


# -- retention -------------------------------------------------------------------------------------


def test_only_ended_jobs_past_retention_are_deleted(repo: JobRepository, clock: MovableClock) -> None:
    asked = reach(repo, Status.INPUT_REQUIRED)
    repo.transition(asked.id, Status.CANCELLED)
    done = reach(repo, Status.COMPLETED)
    running = claimed_job(repo)
    kept = new_job(repo, retention=7200)
    repo.transition(kept.id, Status.CANCELLED)
    clock.advance(3601)
    assert repo.delete_expired(1) == 1
    assert repo.delete_expired(10) == 1
    assert repo.delete_expired(10) == 0
    assert repo.get(asked.id) is None and repo.get(done.id) is None
    assert get_input(repo, asked.id, "q1") is None, "questions go with their job"
    assert repo.get(running.id) is not None, "an active job is ended by the sweeper first, never deleted"
    assert repo.get(kept.id) is not None


def test_count_active(repo: JobRepository) -> None:
    reach(repo, Status.WORKING)
    reach(repo, Status.INPUT_REQUIRED)
    reach(repo, Status.FAILED)
    new_job(repo, principal="local:bob")
    assert count_active(repo) == 3
    assert count_active(repo, principal="local:alice") == 2
    assert count_active(repo, principal="local:nobody") == 0
    assert {Status(s) for s in ("working", "input_required")} == ACTIVE


def test_list_jobs_by_principal_match_pins_one_component(repo: JobRepository) -> None:
    """An operator's `--principal VALUE`: the stored form, a local name, a token's subject or client id,
    exactly and case-sensitively; wildcards, quotes and JSON escapes in VALUE are literal, and a value
    that only spans components (or sits in the issuer) matches nothing."""
    principals = {
        "alice": token_form(None, "reports-app", "alice"),
        "client-alice": token_form("https://idp.example", "alice", "bob"),
        "no-subject": token_form(None, "alice", None),
        "local-alice": "local:alice",
        "quoted": token_form(None, "reports-app", 'q"u%o_te\\'),
        "spanning": token_form('a",', ",zz", None),
        "custom": "tenant:acme",
    }
    ids = {name: new_job(repo, principal=principal).id for name, principal in principals.items()}

    def matching(value: str) -> set[str]:
        found = repo.list_jobs(principal_matching=principal_match(value), limit=100)
        return {name for name, job_id in ids.items() if job_id in {job.id for job in found}}

    assert matching("alice") == {"alice", "client-alice", "no-subject", "local-alice"}
    assert matching("reports-app") == {"alice", "quoted"}
    assert matching("bob") == {"client-alice"}
    assert matching('q"u%o_te\\') == {"quoted"}
    assert matching(principals["alice"]) == {"alice"}
    assert matching("tenant:acme") == {"custom"}
    assert matching(",zz") == {"spanning"}
    for value in [
        "Alice",
        "ALICE",
        "%",
        "_",
        "*",
        "?",
        "[",
        "al_ce",
        "al%",
        "q",
        ",",
        "https://idp.example",
        "bob,",
    ]:
        assert matching(value) == set(), value


def test_every_claim_records_its_attempt_and_node(repo: JobRepository, clock: MovableClock) -> None:
    """The claim log: one entry per claim (by id or the next queued), written by the claim's own UPDATE;
    a job handed back without failing (`resuming`) is claimed again under the same attempt."""
    job = claimed_job(repo, OWNER)
    first_claim = clock.now
    assert repo.release(job.id, OWNER, run_after=clock.now, message=None)
    clock.advance(1)
    [again] = repo.claim_next(OTHER_OWNER, ["report"], 1, 30)
    assert repo.release(job.id, OTHER_OWNER, run_after=clock.now, message=None, resuming=True)
    clock.advance(1)
    resumed = claim(repo, job.id, OWNER, 30)
    assert resumed is not None and resumed.attempts == 2
    log = claims_of(resumed)
    assert [(c.attempt, c.node) for c in log] == [(1, OWNER), (2, OTHER_OWNER), (2, OWNER)]
    assert [c.claimed_at for c in log] == [first_claim, first_claim + timedelta(seconds=1), clock.now]
    assert claims_of(again) == log[:2], "claim_next returns the log as its UPDATE left it"
    assert [c.resumed for c in log] == [False, False, True]


def test_switches_keep_their_last_change_with_who_and_when(repo: JobRepository, clock: MovableClock) -> None:
    assert repo.switches() == []
    now, before = repo.set_switch("tasks", engaged=True, by="alice", reason="rollback")
    assert before is None
    assert (now.engaged, now.changed_by, now.reason, now.changed_at) == (True, "alice", "rollback", clock.now)
    clock.advance(60)
    repo.set_switch("paused:report", engaged=True, by="bob", retry_after_seconds=90)
    released, was = repo.set_switch("tasks", engaged=False, by="carol")
    assert was is not None and was.engaged and was.changed_by == "alice"
    assert (released.engaged, released.changed_by, released.reason) == (False, "carol", None)
    stored = {row.name: row for row in repo.switches()}
    assert set(stored) == {"tasks", "paused:report"}
    assert (stored["tasks"].engaged, stored["tasks"].changed_by, stored["tasks"].changed_at) == (
        False,
        "carol",
        clock.now,
    )
    paused = stored["paused:report"]
    assert (paused.engaged, paused.retry_after_seconds, paused.changed_by) == (True, 90, "bob")


def test_operators_setting_one_switch_at_once_both_succeed_and_one_change_is_last(
    repo: JobRepository, pool: ThreadPoolExecutor
) -> None:
    """Two operators creating the same switch at the same moment: neither fails; the row holds one of them."""
    for trial in range(TRIALS // 3):
        name = f"paused:race{trial}"
        outcomes = race(
            pool,
            lambda name=name: repo.set_switch(name, engaged=True, by="alice"),
            lambda name=name: repo.set_switch(name, engaged=True, by="bob"),
        )
        assert all(row.engaged for row, _ in outcomes)
        stored = {row.name: row for row in repo.switches()}[name]
        assert stored.changed_by in ("alice", "bob")


@pytest.mark.parametrize("asking", [False, True], ids=["working", "input_required"])
def test_a_crashed_retry_job_is_queued_again_working_without_a_lease(
    repo: JobRepository, clock: MovableClock, asking: bool
) -> None:
    """A `retry` job whose node died goes back to the queue as `working`, whether it was running or had just
    asked a question (its lease not yet given up by parking): nobody holds it, and a claim runs it again."""
    job = claimed_job(repo)
    with repo._writing() as session:  # a retry job, as `on_interrupt="retry"` declares it
        stored = session.get(JobRecord, job.id)
        assert stored is not None
        stored.on_interrupt, stored.max_attempts = "retry", 3
        session.add(stored)
    if asking:
        assert repo.open_input(job.id, OWNER, "q1", "Approve?", SCHEMA) is None
    clock.advance(31)  # past the lease of `claimed_job`
    assert repo.settle_interrupted(job.id, OWNER, shutdown=False, lease_expired=True) is Status.WORKING
    record = repo.get(job.id)
    assert record is not None
    assert (record.status, record.lease_owner, record.lease_expires_at) == ("working", None, None)
    assert record.input_deadline is None and record.finished_at is None
