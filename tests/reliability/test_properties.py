"""Property-based tests (hypothesis): the store against a model, and the transition table under any
interleaving.

`StoreMachine` drives the real repository (SQLite file, audit triggers) and the real sweeper
(`Runtime.sweep_once`) through random sequences of start, claim, progress, ask, answer, cancel,
complete, fail, durable steps, heartbeats, crashes (an owner stops forever; a restarted process is a
new owner), clock jumps and sweeps, and checks after every step that the store holds exactly what a
plain-Python model of the rules says: status, lease, attempts, cancel request, pending questions,
step ledger, deletion. Independently of the model, the triggers must never have seen an edge the
transition table does not allow, and a completed step must never be handed out to run again.

`PROPERTY_EXAMPLES` (runs) and `PROPERTY_STEPS` (steps per run) raise the effort; `PROPERTY_SHRINK=1`
shrinks a failing run to its shortest form (slow).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from sqlalchemy import create_engine, text

from handles.config import HandlesConfig
from handles.errors import LeaseLost
from handles.runtime import Runtime
from handles.sealing import Sealer
from handles.states import ACTIVE, TERMINAL, Status, can_transition
from handles.store import JobRecord, JobRepository, Store
from tests.reliability.support import install_audit, invalid_edges
from tests.support import claim

pytestmark = pytest.mark.timeout(300)

EXAMPLES = int(os.environ.get("PROPERTY_EXAMPLES", "60"))
LEASE = 10.0
W, Q, C, F, X = Status.WORKING, Status.INPUT_REQUIRED, Status.COMPLETED, Status.FAILED, Status.CANCELLED

_template: Path | None = None
_SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") else None
"""Runs write thousands of small transactions: on tmpfs when there is one."""


def template_database() -> Path:
    """One migrated SQLite file with the audit triggers; each run starts from a copy of it."""
    global _template
    if _template is None:
        directory = Path(tempfile.mkdtemp(prefix="handles-properties-", dir=_SCRATCH))
        _template = directory / "template.db"
        install_audit(f"sqlite:///{_template.as_posix()}")
    return _template


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2030, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


@dataclass
class ModelJob:
    """What the rules say a stored job looks like."""

    id: str
    on_interrupt: str
    max_attempts: int
    expires_at: datetime
    keep_result: float | None
    input_timeout: float | None
    abandon_after: float | None
    abandon_at: datetime | None
    run_after: datetime
    status: Status = W
    lease: str | None = None
    lease_expires: datetime | None = None
    attempts: int = 0
    cancel_requested: bool = False
    input_deadline: datetime | None = None
    pending: set[str] = field(default_factory=set)
    answered: set[str] = field(default_factory=set)
    steps: dict[str, str] = field(default_factory=dict)
    deleted: bool = False

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    def finish(self, target: Status, now: datetime) -> None:
        self.status = target
        self.lease = self.lease_expires = self.input_deadline = self.abandon_at = None
        if self.keep_result is not None:
            self.expires_at = min(self.expires_at, now + timedelta(seconds=self.keep_result))


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="handles-run-", dir=_SCRATCH))
        database = self.directory / "store.db"
        shutil.copy(template_database(), database)
        self.url = f"sqlite:///{database.as_posix()}"
        self.clock = Clock()
        self.repo = JobRepository(self.url, clock=self.clock)
        self.reader = create_engine(self.url)
        self.loop = asyncio.new_event_loop()
        config = HandlesConfig(data_dir=self.directory, secret_keys=("p" * 40,), lease_seconds=LEASE)
        self.runtime = Runtime(
            store=Store.of(self.repo), config=config, specs={}, sealer=Sealer(config.resolved_secret_keys())
        )
        self.model: dict[str, ModelJob] = {}
        self.alive = ["owner-1", "owner-2"]
        self.owners_made = 2

    def teardown(self) -> None:
        try:
            assert invalid_edges(self.url) == [], "a status change the transition table does not allow"
        finally:
            self.repo.dispose()
            self.reader.dispose()
            self.loop.close()
            shutil.rmtree(self.directory, ignore_errors=True)

    @property
    def now(self) -> datetime:
        return self.clock.now

    # -- choosing what to act on: mostly what a real runtime would touch, sometimes anything --------------

    def _pick(self, data: st.DataObject, fits: Callable[[ModelJob], bool]) -> ModelJob:
        fitting = [m.id for m in self.model.values() if fits(m)]
        if fitting and data.draw(st.integers(0, 4), label="fitting") != 4:
            return self.model[data.draw(st.sampled_from(fitting), label="job")]
        return self.model[data.draw(st.sampled_from(sorted(self.model)), label="job")]

    def _owner(self, data: st.DataObject) -> str:
        return data.draw(st.sampled_from(self.alive), label="owner")

    def _holder(self, job: ModelJob, data: st.DataObject) -> str:
        """Mostly the live lease holder (what a runtime does), sometimes anyone (what a bug would do)."""
        if job.lease in self.alive and data.draw(st.integers(0, 3), label="honest") != 3:
            return job.lease
        return self._owner(data)

    def _running(self, m: ModelJob) -> bool:
        return not m.deleted and m.active and m.lease in self.alive

    # -- jobs ----------------------------------------------------------------------------------------------

    @initialize()
    def first_jobs(self) -> None:
        """Three jobs: two already running (one per owner), one queued."""
        for owner, on_interrupt in (("owner-1", "retry"), ("owner-2", "fail"), (None, "retry")):
            m = self._insert(on_interrupt, 3, None, 600.0, None)
            if owner is not None:
                assert claim(self.repo, m.id, owner, LEASE) is not None
                m.lease, m.lease_expires, m.attempts = owner, self.now + timedelta(seconds=LEASE), 1

    @rule(
        on_interrupt=st.sampled_from(["fail", "retry"]),
        max_attempts=st.integers(1, 3),
        keep=st.sampled_from([None, 30.0, 3600.0]),
        timeout=st.sampled_from([None, 20.0, 600.0]),
        abandon=st.sampled_from([None, 40.0]),
    )
    def start(self, **options: Any) -> None:
        if len(self.model) < 10:
            self._insert(**options)

    def _insert(
        self,
        on_interrupt: str,
        max_attempts: int,
        keep: float | None,
        timeout: float | None,
        abandon: float | None,
    ) -> ModelJob:
        job_id = f"job-{len(self.model) + 1}"
        attempts = max_attempts if on_interrupt == "retry" else 1
        expires = self.now + timedelta(hours=2)
        abandon_at = None if abandon is None else self.now + timedelta(seconds=abandon)
        record = JobRecord(
            id=job_id, kind="k", principal="p", status=W.value, arguments={}, arguments_digest="d",
            created_at=self.now, updated_at=self.now, run_after=self.now, expires_at=expires,
            on_interrupt=on_interrupt, max_attempts=attempts, keep_result_seconds=keep,
            input_timeout_seconds=timeout, abandon_after_seconds=abandon, abandon_at=abandon_at,
        )  # fmt: skip
        _, created = self.repo.insert(record, active_limit=1000)
        assert created
        model = self.model[job_id] = ModelJob(
            id=job_id, on_interrupt=on_interrupt, max_attempts=attempts, expires_at=expires, keep_result=keep,
            input_timeout=timeout, abandon_after=abandon, abandon_at=abandon_at, run_after=self.now,
        )  # fmt: skip
        return model

    @rule(data=st.data())
    def claim(self, data: st.DataObject) -> None:
        m = self._pick(data, lambda m: not m.deleted and m.status is W and m.lease is None)
        owner = self._owner(data)
        got = claim(self.repo, m.id, owner, LEASE)
        expected = (
            not m.deleted
            and m.status is W
            and m.lease is None
            and not m.cancel_requested
            and m.run_after <= self.now
        )
        event(f"claim: {'taken' if expected else 'refused'}")
        assert (got is not None) is expected
        if expected:
            m.lease, m.lease_expires, m.attempts = owner, self.now + timedelta(seconds=LEASE), m.attempts + 1

    @rule(data=st.data())
    def progress(self, data: st.DataObject) -> None:
        m = self._pick(data, self._running)
        owner = self._holder(m, data)
        expected = not m.deleted and m.active and m.lease == owner
        assert self.repo.set_progress(m.id, owner, 1.0, 2.0, "half") is expected

    @rule(key=st.sampled_from(["q1", "q2", "q3"]), data=st.data())
    def ask(self, key: str, data: st.DataObject) -> None:
        m = self._pick(data, self._running)
        owner = self._holder(m, data)
        schema: dict[str, Any] = {"type": "object", "properties": {}}
        if m.deleted:
            return
        if key in m.answered:
            assert self.repo.open_input(m.id, owner, key, "Again?", schema) is not None, (
                "an answer is replayed"
            )
            return
        if m.lease != owner or not m.active:
            with pytest.raises(LeaseLost):
                self.repo.open_input(m.id, owner, key, "Go?", schema)
            return
        assert self.repo.open_input(m.id, owner, key, "Go?", schema) is None
        event("ask: parked")
        m.pending.add(key)
        m.status = Q
        if m.input_deadline is None and m.input_timeout is not None:
            m.input_deadline = self.now + timedelta(seconds=m.input_timeout)

    @rule(keys=st.sets(st.sampled_from(["q1", "q2", "q3", "zz"]), min_size=1), data=st.data())
    def answer(self, keys: set[str], data: st.DataObject) -> None:
        m = self._pick(data, lambda m: not m.deleted and m.status is Q)
        outcome = self.repo.answer_inputs(m.id, {key: {"ok": True} for key in keys})
        if m.deleted:
            assert outcome is None
            return
        assert outcome is not None
        if m.status is not Q:
            assert outcome.accepted == [] and sorted(outcome.ignored) == sorted(keys)
            return
        accepted = keys & m.pending
        assert sorted(outcome.accepted) == sorted(accepted)
        if accepted and len(accepted) == len(m.pending):
            event("answer: resumed")
            m.status, m.input_deadline = W, None
        m.pending -= accepted
        m.answered |= accepted

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        m = self._pick(data, lambda m: not m.deleted and m.active and m.lease is not None)
        outcome = self.repo.request_cancel(m.id)
        if m.deleted:
            assert outcome is None
            return
        assert outcome is not None
        ends_now = m.active and m.lease is None
        self._model_cancel(m)
        event(f"cancel: {'ended' if ends_now else 'requested' if m.active else 'too late'}")
        assert outcome.ended_now is ends_now

    def _model_cancel(self, m: ModelJob) -> None:
        if m.status in TERMINAL:
            return
        m.cancel_requested = True
        if m.lease is None:
            m.finish(X, self.now)

    @rule(goal=st.sampled_from([C, F, X, W, Q]), data=st.data())
    def end(self, goal: Status, data: st.DataObject) -> None:
        """The runtime storing an outcome (completed, failed, cancelled), or an edge nobody may take."""
        m = self._pick(data, self._running)
        owner = self._holder(m, data)
        changed = self.repo.transition(m.id, goal, owner=owner)
        expected = not m.deleted and can_transition(m.status, goal) and m.lease == owner
        event(f"{m.status.value} -> {goal.value}: {'taken' if expected else 'refused'}")
        assert changed is expected
        if expected:
            if goal in TERMINAL:
                m.finish(goal, self.now)
            else:
                m.status = goal
                if goal is W:
                    m.input_deadline = None

    @rule(
        name=st.sampled_from(["charge", "ship"]),
        outcome=st.sampled_from(["completed", "completed", "failed", None]),
        data=st.data(),
    )
    def step(self, name: str, outcome: str | None, data: st.DataObject) -> None:
        """A durable step begins and records its outcome (None: the owner dies inside it)."""
        m = self._pick(data, self._running)
        owner = self._holder(m, data)
        if m.deleted or m.lease != owner or not m.active:
            with pytest.raises(LeaseLost):
                self.repo.begin_step(m.id, owner, name, m.attempts)
            return
        record, fresh = self.repo.begin_step(m.id, owner, name, m.attempts)
        before = m.steps.get(name)
        event(f"step {before} -> {'run' if fresh else 'replayed'}")
        assert not (fresh and before == "completed"), "a completed step would run twice"
        assert not (fresh and before == "started"), "a step with an unknown outcome would run again"
        assert fresh is (before in (None, "failed"))
        if not fresh:
            assert record.status == before
            return
        m.steps[name] = "started"
        if outcome is None:
            self._crash(owner)
            return
        self.repo.finish_step(
            m.id,
            owner,
            name,
            result={"ok": 1} if outcome == "completed" else None,
            error="boom" if outcome == "failed" else None,
        )
        m.steps[name] = outcome

    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        owner = self._owner(data)
        strays = data.draw(st.lists(st.sampled_from(sorted(self.model)), max_size=2), label="strays")
        ids = sorted({m.id for m in self.model.values() if m.lease == owner} | set(strays))
        cancelled, lost = self.repo.heartbeat(owner, ids, LEASE)
        held = {
            i
            for i in ids
            if not self.model[i].deleted and self.model[i].lease == owner and self.model[i].active
        }
        assert lost == set(ids) - held
        assert cancelled == {i for i in held if self.model[i].cancel_requested}
        for job_id in held:
            self.model[job_id].lease_expires = self.now + timedelta(seconds=LEASE)

    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        """An owner's process dies: it never writes again. Its restart is a new owner."""
        self._crash(self._owner(data))

    def _crash(self, owner: str) -> None:
        self.alive.remove(owner)
        self.owners_made += 1
        self.alive.append(f"owner-{self.owners_made}")

    @rule(data=st.data())
    def keep_alive(self, data: st.DataObject) -> None:
        m = self._pick(data, lambda m: m.abandon_after is not None)
        self.repo.touch_abandon_deadline(m.id)
        if not m.deleted and m.abandon_after is not None and m.status not in TERMINAL:
            m.abandon_at = self.now + timedelta(seconds=m.abandon_after)

    @rule(seconds=st.sampled_from([0.5, 3.0, 11.0, 25.0, 45.0, 700.0, 7300.0]))
    def advance(self, seconds: float) -> None:
        self.clock.now += timedelta(seconds=seconds)

    @rule()
    def sweep(self) -> None:
        now = self.now
        for m in self.model.values():
            expired = m.lease_expires is not None and m.lease_expires < now
            if m.deleted or not m.active or m.lease is None or not expired:
                continue
            if m.cancel_requested:  # its process died after a cancel request: the cancel wins
                m.finish(X, now)
            elif m.on_interrupt == "retry" and m.attempts < m.max_attempts:
                m.status, m.lease, m.lease_expires = W, None, None
                m.run_after = now + timedelta(seconds=min(2 ** max(m.attempts - 1, 0), 60))
            else:
                m.finish(F, now)
        live = [m for m in self.model.values() if not m.deleted]
        ttl = [m for m in live if m.active and m.expires_at < now]
        late = [m for m in live if m.status is Q and m.input_deadline is not None and m.input_deadline < now]
        abandoned = [
            m
            for m in live
            if m.active and not m.cancel_requested and m.abandon_at is not None and m.abandon_at < now
        ]
        for m in ttl + late:
            if m.active:
                m.finish(F, now)
        for m in abandoned:
            self._model_cancel(m)
        for m in live:
            if m.status in TERMINAL and m.expires_at < now:
                m.deleted = True
        counts = self.loop.run_until_complete(self.runtime.sweep_once())
        for name, count in counts.items():
            if count:
                event(f"sweep {name}")

    # -- the store agrees with the model ------------------------------------------------------------------

    @invariant()
    def store_matches_model(self) -> None:
        with self.reader.connect() as connection:
            stored = {
                row.id: row
                for row in connection.execute(
                    text(
                        "SELECT id, status, lease_owner, attempts, max_attempts, cancel_requested_at, finished_at FROM handles_jobs"
                    )
                )
            }
            pending: dict[str, set[str]] = {}
            for job_id, key in connection.execute(
                text("SELECT job_id, key FROM handles_input_requests WHERE answered_at IS NULL")
            ):
                pending.setdefault(job_id, set()).add(key)
            steps: dict[str, dict[str, str]] = {}
            for job_id, name, status in connection.execute(
                text("SELECT job_id, name, status FROM handles_steps")
            ):
                steps.setdefault(job_id, {})[name] = status
        for m in self.model.values():
            job = stored.get(m.id)
            if m.deleted:
                assert job is None, f"{m.id} should have been deleted"
                assert m.id not in pending and m.id not in steps, "a deleted job left rows behind"
                continue
            assert job is not None, f"{m.id} vanished while its retention lasts (status {m.status})"
            assert Status(job.status) is m.status, (m.id, job.status, m.status)
            assert job.lease_owner == m.lease, (m.id, job.lease_owner, m.lease)
            assert job.attempts == m.attempts <= job.max_attempts
            assert (job.cancel_requested_at is not None) is m.cancel_requested
            assert pending.get(m.id, set()) == m.pending
            assert steps.get(m.id, {}) == m.steps
            if m.status in TERMINAL:
                assert job.lease_owner is None and job.finished_at is not None


StoreMachine.TestCase.settings = settings(
    max_examples=EXAMPLES,
    # Shrinking a failing run of 50 steps takes minutes; the unshrunk steps are printed either way.
    phases=list(Phase) if os.environ.get("PROPERTY_SHRINK") else [p for p in Phase if p is not Phase.shrink],
    stateful_step_count=int(os.environ.get("PROPERTY_STEPS", "50")),
    deadline=None,
    database=None,  # nothing written into the repository; a failure prints its steps
    suppress_health_check=list(HealthCheck),
)
test_the_store_follows_its_model_under_random_interleavings = StoreMachine.TestCase
