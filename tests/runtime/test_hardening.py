"""Issue 12 item 9: ledger writes check the lease, any principal length, strict settings, memory SQLite,
heartbeats while an outcome is written, worker overrides."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from handles import Handles, HandlesConfig, JobContext
from handles.errors import ConfigurationError, LeaseLost
from handles.states import Status
from handles.store import JobRepository, utc_now
from tests.durability.harness import KEY, config
from tests.harness.waiting import until
from tests.support import claim

from .support import job_row, slowed, start_as, stored, stored_steps


def _leased_job(repo: JobRepository, owner: str) -> str:
    now = utc_now()
    repo.insert(
        job_row("ledger-job", attempts=1, lease_owner=owner, lease_expires_at=now + timedelta(seconds=30))
    )
    return "ledger-job"


def test_a_stale_worker_cannot_rewrite_the_step_ledger(database_url: str) -> None:
    repo = JobRepository(database_url)
    repo.prepare(auto_migrate=True)
    try:
        job_id = _leased_job(repo, "node-a")
        repo.begin_step(job_id, "node-a", "charge", 1)
        with pytest.raises(LeaseLost):
            repo.finish_step(job_id, "node-b", "charge", result="forged")
        assert repo.steps(job_id)[0].status == "started"
        repo.finish_step(job_id, "node-a", "charge", result="ok")
        assert repo.steps(job_id)[0].result == "ok"
    finally:
        repo.dispose()


def test_a_node_that_stands_still_past_its_lease_mid_step_leaves_the_ledger_true(tmp_path: Path) -> None:
    """A node whose heartbeats stall past its lease while a step runs on a worker thread (a long pause, a
    suspended machine, a database that answers it slowly): another node's sweep recovers the job for a
    retry, with the step started and no outcome. The stalled node's step then finishes, and its outcome is
    recorded all the same (only that run knows it, and nobody else has decided it), so the retry replays
    the step instead of failing the job `step_unknown`: the job completes and the effect happened once."""

    async def main() -> None:
        settings = config(tmp_path, lease_seconds=0.6, heartbeat_seconds=0.1)
        stalled, sweeper = Handles(settings), Handles(settings)
        release = threading.Event()
        charges: list[str] = []

        def charge(order: str) -> dict[str, str]:
            release.wait(30)
            charges.append(order)
            return {"receipt": f"r-{order}"}

        for jobs in (stalled, sweeper):

            @jobs.job(on_interrupt="retry", max_attempts=3)
            async def pay(ctx: JobContext, order: str) -> dict[str, str]:
                return dict(await ctx.step("charge", charge, order))

        with slowed(stalled.service.store.repo, "heartbeat", 5.0):
            handle = await start_as(stalled, "alice", "pay", order="o-1")
            owner = stalled.runtime.owner
            deadline = time.monotonic() + 20
            while stored(stalled, handle).lease_owner == owner or "charge" not in stored_steps(
                stalled, handle
            ):
                assert time.monotonic() < deadline, "the job was not recovered from the stalled node"
                await sweeper.runtime.sweep_once()
                await asyncio.sleep(0.1)
            assert stored_steps(stalled, handle)["charge"].status == "started"
            release.set()
            await until(
                lambda: stored_steps(stalled, handle)["charge"].status != "started",
                "the stalled node's step left an outcome",
            )
        await sweeper.start()
        await until(
            lambda: stored(stalled, handle).status in {Status.COMPLETED.value, Status.FAILED.value},
            "the retried job ended",
        )
        await stalled.aclose()
        await sweeper.aclose()
        record = stored(stalled, handle)
        assert record.status == Status.COMPLETED.value, record.error
        assert record.result is not None and record.result["structuredContent"] == {"receipt": "r-o-1"}
        assert record.attempts == 2
        step = stored_steps(stalled, handle)["charge"]
        assert (step.status, step.attempt, step.result) == ("completed", 1, {"receipt": "r-o-1"})
        assert charges == ["o-1"]

    asyncio.run(main())


def test_a_principal_of_any_length_can_start_and_own_jobs(database_url: str, tmp_path: Path) -> None:
    async def main() -> None:
        jobs = Handles(config(tmp_path, database_url=database_url))

        @jobs.job
        async def quick(ctx: JobContext) -> int:
            return 1

        principal = "token:" + "p" * 2000
        handle = await start_as(jobs, principal, "quick")
        record = await jobs.service.open(jobs.specs["quick"], principal, handle)
        assert record.principal == principal
        other = "token:" + "p" * 1999 + "q"  # same prefix, other principal
        with pytest.raises(Exception) as refused:
            await jobs.service.open(jobs.specs["quick"], other, handle)
        assert type(refused.value).__name__ == "UnknownHandle"
        await jobs.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_an_in_memory_sqlite_database_is_refused_with_a_clear_message(tmp_path: Path, url: str) -> None:
    jobs = Handles(config(tmp_path, database_url=url))
    with pytest.raises(ConfigurationError) as refused:
        jobs.service  # noqa: B018 - building the service opens the store
    assert "memory" in str(refused.value) and "sqlite:///" in str(refused.value)


@pytest.mark.parametrize(
    ("variable", "value", "accepted"),
    [
        ("HANDLES_RUN_WORKERS", "enabled", "true"),
        ("HANDLES_LEASE_SECONDS", "0", "greater than 0"),
        ("HANDLES_MAX_RUNNING", "-3", "at least 1"),
        ("HANDLES_DRAIN_SECONDS", "soon", "number"),
        ("HANDLES_PRINCIPAL_SHARE", "2", "between"),
    ],
)
def test_invalid_settings_are_refused_naming_the_variable_and_what_it_accepts(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, accepted: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError) as refused:
        HandlesConfig.from_env()
    assert variable in str(refused.value) and accepted in str(refused.value), str(refused.value)


def test_a_heartbeat_keeps_the_lease_while_a_slow_outcome_is_written(tmp_path: Path) -> None:
    """Another node sweeping while this one writes a slow outcome must not recover the job."""

    async def main() -> None:
        settings = config(tmp_path, lease_seconds=0.6, heartbeat_seconds=0.1)
        runner, sweeper = Handles(settings), Handles(settings)
        for jobs in (runner, sweeper):

            @jobs.job
            async def quick(ctx: JobContext) -> int:
                return 42

        await sweeper.start()
        repo = runner.service.store.repo
        slow_outcome = slowed(
            repo, "transition", 1.5, when=lambda job_id, target, **_: target is Status.COMPLETED
        )
        with slow_outcome:
            handle = await start_as(runner, "alice", "quick")
            for _ in range(20):
                await asyncio.sleep(0.1)
                await sweeper.runtime.sweep_once()
            for _ in range(50):
                if stored(runner, handle).status != Status.WORKING.value:
                    break
                await asyncio.sleep(0.05)
        await runner.aclose()
        await sweeper.aclose()
        record = stored(runner, handle)
        assert record.status == Status.COMPLETED.value, record.status_message

    asyncio.run(main())


def test_overrides_apply_even_after_the_machinery_was_built(tmp_path: Path) -> None:
    """`handles worker` forces run_workers on an app whose service an import already built."""
    jobs = Handles(HandlesConfig(data_dir=tmp_path, secret_keys=(KEY,), run_workers=False))
    assert jobs.runtime.config.run_workers is False
    jobs.reconfigure(run_workers=True)
    assert jobs.config.run_workers and jobs.runtime.config.run_workers and jobs.service.config.run_workers


def test_leases_are_judged_by_the_database_clock_so_a_skewed_node_keeps_its_jobs(postgres_url: str) -> None:
    """PostgreSQL: a node whose clock runs 10 minutes behind claims a job; another node must not see
    that live lease as expired (it would recover, and run twice, a job that is running)."""
    behind = lambda: utc_now() - timedelta(minutes=10)  # noqa: E731
    sweeper = JobRepository(postgres_url)
    sweeper.prepare(auto_migrate=True)
    try:
        for lease_clock, expect_expired in (("database", False), ("local", True)):
            skewed = JobRepository(postgres_url, clock=behind, lease_clock=lease_clock)
            try:
                job_id = f"skew-{lease_clock}"
                skewed.insert(job_row(job_id, run_after=behind()))
                assert claim(skewed, job_id, "skewed-node", 30) is not None
                expired = {record.id for record in sweeper.expired_leases(100)}
                assert (job_id in expired) is expect_expired, lease_clock
                skewed.heartbeat("skewed-node", [job_id], 30)
                expired = {record.id for record in sweeper.expired_leases(100)}
                assert (job_id in expired) is expect_expired, lease_clock
            finally:
                skewed.dispose()
    finally:
        with sweeper.engine.begin() as connection:
            connection.execute(text("delete from handles_jobs where id like 'skew-%'"))
        sweeper.dispose()
