"""A graceful stop drains: running jobs finish, what cannot finish is handed over, nothing restarts.

Issue 12 items 1, 5 and 8. Each test drives the real `Handles` on an SQLite file.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from handles import Handles, JobContext
from handles.errors import CallerError
from handles.states import Status
from handles.store import JobRepository, utc_now
from tests.durability.harness import config

from .support import job_row, settled, slowed, start_as, stored, until_begun


async def _begun_for_30_seconds(jobs: Handles, name: str, **options: Any) -> str:
    """Declare the job `name` (`options` as `jobs.job` takes them), which runs for 30 s; start it as alice and
    wait until it runs. Its handle."""
    began = asyncio.Event()

    async def thirty_seconds(ctx: JobContext) -> int:
        began.set()
        await asyncio.sleep(30)
        return 1

    jobs.job(name=name, **options)(thirty_seconds)
    handle = await start_as(jobs, "alice", name)
    await until_begun(began)
    return handle


def test_graceful_stop_lets_a_nearly_finished_job_complete(tmp_path: Path) -> None:
    async def main() -> None:
        jobs = Handles(config(tmp_path))  # default drain
        began = asyncio.Event()

        @jobs.job
        async def almost_done(ctx: JobContext) -> str:
            began.set()
            await asyncio.sleep(0.5)
            return "finished"

        handle = await start_as(jobs, "alice", "almost_done")
        await until_begun(began)
        await jobs.aclose()
        record = stored(jobs, handle)
        assert record.status == Status.COMPLETED.value, record.status_message
        assert record.result is not None and record.result["structuredContent"] == {"result": "finished"}

    asyncio.run(main())


def test_calls_after_close_are_refused_as_retryable_and_the_runtime_stays_stopped(tmp_path: Path) -> None:
    async def main() -> None:
        jobs = Handles(config(tmp_path))

        @jobs.job
        async def quick(ctx: JobContext) -> int:
            return 1

        await start_as(jobs, "alice", "quick")
        await jobs.aclose()
        with pytest.raises(CallerError) as refused:
            await start_as(jobs, "alice", "quick")
        assert refused.value.retryable
        assert "shutting down" in refused.value.message
        assert "retry" in refused.value.next_step.lower()
        assert not jobs.runtime.started

    asyncio.run(main())


def test_a_retry_job_longer_than_the_drain_is_handed_over_at_once(tmp_path: Path) -> None:
    """Released for any node at once (not after the lease runs out), and not counted as a failed attempt."""

    async def main() -> None:
        runs: list[int] = []
        began = asyncio.Event()

        def declare(jobs: Handles) -> None:
            @jobs.job(on_interrupt="retry", max_attempts=2)
            async def long_report(ctx: JobContext) -> int:
                began.set()
                runs.append(ctx.attempt)
                await asyncio.sleep(1.0 if len(runs) == 1 else 0.05)
                return len(runs)

        first = Handles(config(tmp_path, drain_seconds=0.2, lease_seconds=30))
        declare(first)
        handle = await start_as(first, "alice", "long_report")
        await until_begun(began)
        await first.aclose()
        record = stored(first, handle)
        assert record.status == Status.WORKING.value and record.lease_owner is None
        assert record.run_after <= utc_now()

        second = Handles(config(tmp_path, lease_seconds=30))
        declare(second)
        await second.start()
        try:
            await settled(second, handle)
        finally:
            await second.aclose()
        assert stored(second, handle).status == Status.COMPLETED.value
        assert len(runs) == 2
        assert stored(second, handle).attempts == 1, "a hand-over at a shutdown is not a failed attempt"

    asyncio.run(main())


def test_a_fail_job_longer_than_the_drain_ends_failed_saying_it_was_a_shutdown(tmp_path: Path) -> None:
    async def main() -> None:
        jobs = Handles(config(tmp_path, drain_seconds=0.2))
        handle = await _begun_for_30_seconds(jobs, "slow_export")
        await jobs.aclose()
        record = stored(jobs, handle)
        assert record.status == Status.FAILED.value
        assert "shut" in (record.status_message or "").lower(), record.status_message

    asyncio.run(main())


def test_cancel_then_stop_ends_cancelled(tmp_path: Path) -> None:
    """Item 5: a cancel-requested `retry` job that loses its process ends `cancelled`, never queued again."""

    async def main() -> None:
        jobs = Handles(config(tmp_path, drain_seconds=0.2, cancel_grace_seconds=30))
        handle = await _begun_for_30_seconds(jobs, "stubborn", on_interrupt="retry")
        job = await jobs.service.open(jobs.specs["stubborn"], "alice", handle)
        await jobs.service.cancel(job)
        await jobs.aclose()
        assert stored(jobs, handle).status == Status.CANCELLED.value

    asyncio.run(main())


def test_cancel_requested_job_whose_process_died_ends_cancelled_on_the_next_sweep(tmp_path: Path) -> None:
    """Item 5, the kill -9 form: the lease of a cancel-requested `retry` job runs out."""

    async def main() -> None:
        jobs = Handles(config(tmp_path))

        @jobs.job(on_interrupt="retry")
        async def stubborn(ctx: JobContext) -> int:
            return 1

        await jobs.start()
        now = utc_now()
        repo = JobRepository(jobs.config.resolved_database_url())
        try:
            repo.insert(
                job_row(
                    "dead-node-job",
                    kind="stubborn",
                    on_interrupt="retry",
                    max_attempts=3,
                    attempts=1,
                    lease_owner="a-node-that-died",
                    lease_expires_at=now - timedelta(seconds=1),
                    cancel_requested_at=now - timedelta(seconds=2),
                )
            )
        finally:
            repo.dispose()
        await jobs.runtime.sweep_once()
        await jobs.aclose()
        assert stored(jobs, "dead-node-job").status == Status.CANCELLED.value

    asyncio.run(main())


def test_a_job_whose_body_returned_is_not_interrupted_while_its_outcome_is_written(tmp_path: Path) -> None:
    """The drain's deadline lands while a finished job flushes its last progress: it still ends completed
    (before, the interrupt cancelled the flush and the job stayed `working` under a dead lease)."""

    async def main() -> None:
        jobs = Handles(config(tmp_path, drain_seconds=0.05, progress_flush_seconds=1.0))
        returning = asyncio.Event()

        @jobs.job
        async def quick(ctx: JobContext) -> int:
            await ctx.progress(1, 2)  # written at once (slowly)
            await ctx.progress(2, 2)  # coalesced: left for the final flush
            returning.set()
            return 2

        await jobs.start()
        repo = jobs.service.store.repo
        with slowed(repo, "set_progress", 0.4):  # a slow disk
            handle = await start_as(jobs, "alice", "quick")
            # The body has returned; its final flush takes 0.4 s, and the drain's deadline lands in 0.05 s,
            # however loaded the machine is.
            await asyncio.wait_for(returning.wait(), 10)
            await jobs.aclose()
        record = stored(jobs, handle)
        assert record.status == Status.COMPLETED.value, (record.status, record.status_message)

    asyncio.run(main())
