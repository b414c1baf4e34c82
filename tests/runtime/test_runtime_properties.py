"""A stateful property test of the real runtime: starts, answers, cancels, graceful stops and crashes.

Two nodes (`Handles` instances) share one SQLite file and run on one event loop. Hypothesis drives
random sequences of starts (of several principals), answers, cancels, passing time, sweeps, graceful
stops and crashes (a node vanishes without writing anything; a restarted node is a new owner), and
checks after every step:

- no node ever runs more jobs at once than `max_running`;
- no durable step's effect is applied twice;
- no job is stored `cancelled` while one of its steps executes, and every applied effect is in
  the ledger (`completed`, or `unknown` past the hard limit) once the nodes are quiet;
- no job stays `working` under a lease that ran out more than a lease period plus a sweep ago;

and at the end, once every node has run undisturbed, that every job is terminal or parked.

`RUNTIME_PROPERTY_EXAMPLES` raises the number of runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
from collections import Counter, defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from pydantic import BaseModel

from handles import Handles, JobContext
from handles.states import Status
from handles.store import JobRepository, utc_now
from tests.durability.harness import config, crash

pytestmark = pytest.mark.timeout(600)

EXAMPLES = int(os.environ.get("RUNTIME_PROPERTY_EXAMPLES", "12"))
MAX_RUNNING = 2
LEASE = 0.6
PRINCIPALS = ("alice", "bob")


class Go(BaseModel):
    go: bool


class World:
    """What the jobs themselves observe: effects applied, bodies executing per node, violations."""

    def __init__(self, url: str) -> None:
        self.effects: Counter[str] = Counter()
        self.executing: defaultdict[str, list[tuple[str, str]]] = defaultdict(list)
        """Per node name: (job id, runtime owner) of every job body executing there now."""
        self.violations: list[str] = []
        self.dead_owners: set[str] = set()
        self.applied: list[tuple[str, str, str]] = []  # (job, step, owner) of every applied effect
        self.runtime_log: list[str] = []  # the runtime's warnings and notices, for a failure's message
        self.longest_pause = 0.0  # the event loop's longest stand-still between two rules, in seconds
        self.repo = JobRepository(url)

    def explain(self, job_id: str) -> str:
        """What the store and the runtime's log say of `job_id` (a failure's message)."""
        record = self.repo.get(job_id)
        stored = None if record is None else (record.status, record.attempts, record.error)
        applied = [(step, owner) for job, step, owner in self.applied if job == job_id]
        lines = [line for line in self.runtime_log if job_id in line]
        return (
            f"stored {stored}; applied (step, owner) {applied}; dead {sorted(self.dead_owners)}; log {lines}; "
            f"the loop's longest pause between rules {self.longest_pause:.3f} s (lease {LEASE} s)"
        )

    def status(self, job_id: str) -> str | None:
        record = self.repo.get(job_id)
        return None if record is None else record.status


def declare(jobs: Handles, world: World, node: str) -> None:
    def effect(job_id: str, name: str, seconds: float, owner: str) -> str:
        """A synchronous step (it runs on a worker thread, which a cancel cannot interrupt)."""
        time.sleep(seconds)
        crashed = owner in world.dead_owners  # a crash would have killed this thread
        if not crashed and world.status(job_id) == Status.CANCELLED.value:
            world.violations.append(f"{job_id} was stored cancelled while its step {name} executed")
        world.effects[f"{job_id}/{name}"] += 1
        world.applied.append((job_id, name, owner))
        return name

    @jobs.job(asks_input=True, on_interrupt="retry", max_attempts=3)
    async def work(ctx: JobContext, steps: int, asks: bool, seconds: float) -> int:
        running = world.executing[node]
        running.append((ctx.job_id, ctx._writes.owner))
        try:
            if len(running) > MAX_RUNNING:
                # Which runtime ran each (a node restarted gracefully keeps its name, not its owner id).
                bodies = ", ".join(f"{job} on runtime {owner}" for job, owner in running)
                world.violations.append(f"{len(running)} jobs ran at once on {node}: {bodies}")
            for index in range(steps):
                await ctx.step(f"s{index}", effect, ctx.job_id, f"s{index}", seconds, ctx._writes.owner)
                if asks and index == 0:
                    answer = await ctx.ask("Continue?", Go)
                    if not answer.go:
                        return -1
            return steps
        finally:
            with contextlib.suppress(ValueError):  # a crash rule already cleared this node's list
                running.remove((ctx.job_id, ctx._writes.owner))


class _Recorder(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.INFO)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


class RuntimeMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.directory = Path(tempfile.mkdtemp(prefix="handles-runtime-properties-"))
        self.settings = config(
            self.directory,
            max_running=MAX_RUNNING,
            lease_seconds=LEASE,
            heartbeat_seconds=0.1,
            cancel_grace_seconds=0.02,
            step_cancel_limit_seconds=5,
            drain_seconds=0.2,
            store_poll_seconds=0.05,
        )
        self.world = World(self.settings.resolved_database_url())
        self.recorder = _Recorder(self.world.runtime_log)
        runtime_logger = logging.getLogger("handles.runtime")
        self.log_level = runtime_logger.level
        runtime_logger.setLevel(logging.INFO)
        runtime_logger.addHandler(self.recorder)
        self.nodes: dict[str, Handles] = {}
        self.generation: Counter[str] = Counter()
        self.jobs: list[tuple[str, str]] = []  # (principal, job id)
        self.stopped_at: float | None = None

    def run(self, coroutine: Any) -> Any:
        # The loop stands still between rules (no heartbeat then): a pause longer than a lease lets a
        # sweep take a live node's job, whose run then rightly records nothing more but the outcome of the
        # step it was running (`JobRepository.finish_step`). Kept for the message of a failure.
        if self.stopped_at is not None:
            self.world.longest_pause = max(self.world.longest_pause, time.monotonic() - self.stopped_at)
        try:
            return self.loop.run_until_complete(coroutine)
        finally:
            self.stopped_at = time.monotonic()

    def boot(self, name: str) -> None:
        self.generation[name] += 1
        jobs = Handles(self.settings)
        declare(jobs, self.world, name)
        self.run(jobs.start())
        self.nodes[name] = jobs

    @initialize()
    def start_nodes(self) -> None:
        self.boot("a")
        self.boot("b")

    # -- rules -------------------------------------------------------------------

    @rule(
        node=st.sampled_from(["a", "b"]),
        principal=st.sampled_from(PRINCIPALS),
        steps=st.integers(1, 3),
        asks=st.booleans(),
        seconds=st.sampled_from([0.0, 0.05, 0.3]),
    )
    def start(self, node: str, principal: str, steps: int, asks: bool, seconds: float) -> None:
        jobs = self.nodes[node]
        spec = jobs.specs["work"]
        started = self.run(
            jobs.service.start(spec, principal, {"steps": steps, "asks": asks, "seconds": seconds}, None)
        )
        self.jobs.append((principal, started.job.id))

    @precondition(lambda self: bool(self.jobs))
    @rule(pick=st.integers(0, 10_000), node=st.sampled_from(["a", "b"]), go=st.booleans())
    def answer(self, pick: int, node: str, go: bool) -> None:
        # Everything is drawn before the store is read: which jobs wait depends on timing, and
        # hypothesis replays (and shrinks) a run only if its draws do not depend on it.
        waiting = [(p, j) for p, j in self.jobs if self.world.status(j) == Status.INPUT_REQUIRED.value]
        if not waiting:
            return
        _principal, job_id = waiting[pick % len(waiting)]
        jobs = self.nodes[node]
        record = self.world.repo.get(job_id)
        assert record is not None
        self.run(jobs.service.respond(jobs.specs["work"], record, {"q1": {"go": go}}))

    @precondition(lambda self: bool(self.jobs))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        _principal, job_id = data.draw(st.sampled_from(self.jobs))
        jobs = self.nodes[data.draw(st.sampled_from(sorted(self.nodes)))]
        record = self.world.repo.get(job_id)
        assert record is not None
        self.run(jobs.service.cancel(record))

    @rule(seconds=st.sampled_from([0.05, 0.2, 0.5]))
    def pass_time(self, seconds: float) -> None:
        self.run(asyncio.sleep(seconds))

    @rule(node=st.sampled_from(["a", "b"]))
    def sweep(self, node: str) -> None:
        self.run(self.nodes[node].runtime.sweep_once())

    @rule(node=st.sampled_from(["a", "b"]))
    def graceful_restart(self, node: str) -> None:
        self.run(self.nodes[node].aclose())
        self.boot(node)

    @rule(node=st.sampled_from(["a", "b"]))
    def crash(self, node: str) -> None:
        """The node vanishes: its tasks stop where they are and nothing more is written."""
        self.world.dead_owners.add(self.nodes[node].runtime.owner)
        self.run(crash(self.nodes[node]))
        self.world.executing[node].clear()
        self.boot(node)

    # -- invariants ------------------------------------------------------------------

    @invariant()
    def nothing_went_wrong(self) -> None:
        assert self.world.violations == []
        twice = [key for key, count in self.world.effects.items() if count > 1]
        assert twice == [], f"effects applied twice: {twice}"

    @invariant()
    def no_stale_working_lease(self) -> None:
        slack = timedelta(seconds=LEASE + self.settings.sweep_interval_seconds + 2)
        now = utc_now()
        for _principal, job_id in self.jobs:
            record = self.world.repo.get(job_id)
            if record is None or record.status != Status.WORKING.value or record.lease_expires_at is None:
                continue
            # Sweeps are rules here: a lease may be stale only until the next sweep rule runs.
            if record.lease_expires_at < now - slack:
                self.run(self.nodes["a"].runtime.sweep_once())
                again = self.world.repo.get(job_id)
                assert again is not None
                assert (
                    again.lease_expires_at is None
                    or again.lease_expires_at >= now - slack
                    or (again.status != Status.WORKING.value)
                ), f"{job_id} stays working under a lease that ran out at {record.lease_expires_at}"

    def teardown(self) -> None:
        try:
            self.quiesce()
        finally:
            for jobs in self.nodes.values():
                self.run(jobs.aclose())
            self.world.repo.dispose()
            self.loop.close()
            runtime_logger = logging.getLogger("handles.runtime")
            runtime_logger.removeHandler(self.recorder)
            runtime_logger.setLevel(self.log_level)

    def quiesce(self) -> None:
        """Let the nodes run undisturbed: every job ends or waits for an answer, nothing runs twice."""
        deadline = self.loop.time() + 30
        while self.loop.time() < deadline:
            self.run(asyncio.sleep(0.2))
            for jobs in self.nodes.values():
                self.run(jobs.runtime.sweep_once())
            statuses = {self.world.status(j) for _, j in self.jobs}
            if statuses <= {"completed", "failed", "cancelled", "input_required", None}:
                break
        statuses = Counter(self.world.status(j) for _, j in self.jobs)
        assert set(statuses) <= {"completed", "failed", "cancelled", "input_required", None}, statuses
        assert self.world.violations == []
        assert [k for k, n in self.world.effects.items() if n > 1] == []
        # The ledger tells the truth: every effect of a run that did not crash is recorded.
        for job_id, name, owner in self.world.applied:
            if owner in self.world.dead_owners:
                continue  # its node crashed (possibly after the effect): the ledger rightly says started
            steps = {step.name: step.status for step in self.world.repo.steps(job_id)}
            if job_id in {j for _, j in self.jobs} and steps:
                assert steps.get(name) in ("completed", "unknown"), (
                    f"{job_id}/{name} applied by {owner}, ledger: {steps}; {self.world.explain(job_id)}"
                )


RuntimeMachine.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_runtime_keeps_its_promises = RuntimeMachine.TestCase
