"""Slots: `max_running` is a true cap, parked jobs hold none, principals take turns, a committed start runs.

Issue 12 items 2, 6 and 7, and the fair-slots requirement.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from pydantic import BaseModel

from handles import Handles, JobContext
from handles.states import Status
from tests.durability.harness import config

from .support import slowed, start_as, stored


def test_max_running_is_a_true_cap_under_a_burst_of_starts(tmp_path: Path) -> None:
    async def main() -> None:
        jobs = Handles(config(tmp_path, max_running=2))
        running = 0
        peak = 0

        @jobs.job
        async def busy(ctx: JobContext, n: int) -> int:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.05)
            running -= 1
            return n

        await jobs.start()
        handles: list[str] = []
        for wave in range(8):  # bursts of starts while earlier jobs finish and free their slots
            handles += await asyncio.gather(*(start_as(jobs, "alice", "busy", n=n) for n in range(7)))
            await asyncio.sleep(0.03 * wave)
        try:
            for _ in range(200):
                if all(stored(jobs, h).status == Status.COMPLETED.value for h in handles):
                    break
                await asyncio.sleep(0.05)
        finally:
            await jobs.aclose()
        assert all(stored(jobs, h).status == Status.COMPLETED.value for h in handles)
        assert peak <= 2, f"{peak} jobs ran at once with max_running=2"

    asyncio.run(main())


def test_a_start_cancelled_after_its_commit_still_runs(tmp_path: Path) -> None:
    """Item 6: the caller's request dies between the insert and the hand-over to the runtime."""

    async def main() -> None:
        jobs = Handles(config(tmp_path))

        @jobs.job
        async def quick(ctx: JobContext) -> int:
            return 7

        await jobs.start()
        repo = jobs.service.store.repo
        with slowed(repo, "insert", 0.3, after=True):  # the commit, then a stall
            request = asyncio.create_task(jobs.service.start(jobs.specs["quick"], "alice", {}, "key-1"))
            await asyncio.sleep(0.1)
            request.cancel()
            await asyncio.gather(request, return_exceptions=True)
        retried = await jobs.service.start(jobs.specs["quick"], "alice", {}, "key-1")
        assert not retried.created
        try:
            for _ in range(100):
                if stored(jobs, retried.job.id).status != Status.WORKING.value:
                    break
                await asyncio.sleep(0.05)
        finally:
            await jobs.aclose()
        record = stored(jobs, retried.job.id)
        assert record.status == Status.COMPLETED.value, record.status_message

    asyncio.run(main())


class Go(BaseModel):
    go: bool


def test_parked_jobs_hold_no_slot(tmp_path: Path) -> None:
    """Item 2: 33 of alice's jobs wait for approval; bob's short job still runs at once."""

    async def main() -> None:
        jobs = Handles(config(tmp_path, max_running=32, max_active_per_principal=50))

        @jobs.job(asks_input=True)
        async def needs_approval(ctx: JobContext, n: int) -> int:
            answer = await ctx.ask("Approve?", Go)
            return n if answer.go else -1

        @jobs.job
        async def short_report(ctx: JobContext) -> str:
            await asyncio.sleep(0.3)
            return "report"

        await jobs.start()
        parked = [await start_as(jobs, "alice", "needs_approval", n=n) for n in range(33)]
        for _ in range(200):
            if all(stored(jobs, h).status == Status.INPUT_REQUIRED.value for h in parked):
                break
            await asyncio.sleep(0.05)
        assert all(stored(jobs, h).status == Status.INPUT_REQUIRED.value for h in parked)
        began = time.monotonic()
        report = await start_as(jobs, "bob", "short_report")
        try:
            while stored(jobs, report).status != Status.COMPLETED.value and time.monotonic() - began < 10:
                await asyncio.sleep(0.02)
            took = time.monotonic() - began
        finally:
            await jobs.aclose()
        assert stored(jobs, report).status == Status.COMPLETED.value
        assert took < 0.3 + 1.0, f"bob's 0.3 s job took {took:.2f} s"

    asyncio.run(main())


def test_claims_alternate_between_principals(tmp_path: Path) -> None:
    async def main() -> None:
        jobs = Handles(config(tmp_path, max_running=1))
        order: list[str] = []
        gate = asyncio.Event()

        @jobs.job
        async def work(ctx: JobContext, who: str) -> str:
            if not order:
                await gate.wait()  # hold the only slot while the backlog builds up
            order.append(who)
            return who

        await jobs.start()
        handles = [await start_as(jobs, "alice", "work", who="alice") for _ in range(5)]
        handles += [await start_as(jobs, "bob", "work", who="bob") for _ in range(2)]
        await asyncio.sleep(0.2)
        gate.set()
        try:
            for _ in range(200):
                if len(order) == 7:
                    break
                await asyncio.sleep(0.05)
        finally:
            await jobs.aclose()
        assert len(order) == 7, order
        # after alice's first job, the queue alternates: bob is not served after alice's whole backlog
        assert order[:5] == ["alice", "bob", "alice", "bob", "alice"], order

    asyncio.run(main())
