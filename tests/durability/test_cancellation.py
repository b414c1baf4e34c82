"""Cancellation: a grace period, then an interrupt; cancel racing completion always ends in one stored truth."""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from handles import Handles, JobContext

from .harness import config, rig


def test_job_that_ignores_cancel_is_interrupted_after_the_grace_period(tmp_path: Path) -> None:
    async def main() -> None:
        jobs = Handles(config(tmp_path, cancel_grace_seconds=0.3))
        reached_end = []

        @jobs.job
        async def stubborn(ctx: JobContext) -> int:
            await asyncio.sleep(30)  # never looks at ctx.cancelled
            reached_end.append(True)
            return 1

        async with rig(jobs) as r:
            handle = (await r.ok("stubborn_start"))["handle"]
            await r.ok("stubborn_progress", handle=handle, wait_seconds=1)
            answer = await r.ok("stubborn_cancel", handle=handle)
            assert answer["cancel_requested"] is True and answer["status"] == "working"
            loop = asyncio.get_running_loop()
            began = loop.time()
            final = await r.ok("stubborn_fetch", handle=handle, wait_seconds=10)
            assert final["status"] == "cancelled"
            assert 0.2 < loop.time() - began < 5
            assert reached_end == []
            again = await r.ok("stubborn_cancel", handle=handle)
            assert again["status"] == "cancelled" and "already ended" in again["next"]

    asyncio.run(main())


def test_cooperative_job_sees_cancelled_and_stops_at_its_checkpoint(tmp_path: Path) -> None:
    async def main() -> None:
        jobs = Handles(config(tmp_path, cancel_grace_seconds=30))
        seen: list[bool] = []

        @jobs.job
        async def polite(ctx: JobContext) -> int:
            while True:
                await asyncio.sleep(0.02)
                if ctx.cancelled:
                    seen.append(True)
                    await ctx.checkpoint()

        async with rig(jobs) as r:
            handle = (await r.ok("polite_start"))["handle"]
            await r.ok("polite_progress", handle=handle, wait_seconds=1)
            await r.ok("polite_cancel", handle=handle)
            final = await r.ok("polite_fetch", handle=handle, wait_seconds=5)
            assert final["status"] == "cancelled" and seen == [True]

    asyncio.run(main())


def test_cancel_racing_completion_ends_in_one_consistent_terminal_state(tmp_path: Path) -> None:
    trials = 40

    async def main() -> None:
        jobs = Handles(config(tmp_path, cancel_grace_seconds=0.05))

        @jobs.job
        async def racer(ctx: JobContext, delay_ms: int) -> int:
            await asyncio.sleep(delay_ms / 1000)
            return delay_ms

        outcomes: dict[str, int] = {}
        async with rig(jobs) as r:
            for _ in range(trials):
                delay = random.randint(0, 8)
                handle = (await r.ok("racer_start", delay_ms=delay))["handle"]
                await asyncio.sleep(random.uniform(0, 0.01))
                cancel = await r.ok("racer_cancel", handle=handle)
                body, is_error = await r.call("racer_fetch", handle=handle, wait_seconds=5)
                status = body["status"]
                assert status in ("completed", "cancelled"), body
                assert cancel["status"] in ("working", status)
                if status == "completed":
                    assert not is_error and body["result"] == {"result": delay}
                else:
                    assert body.get("result") is None
                # the stored state agrees with what every view reports, and never changes again
                later = await r.ok("racer_progress", handle=handle)
                assert later["status"] == status
                outcomes[status] = outcomes.get(status, 0) + 1
        assert sum(outcomes.values()) == trials

    asyncio.run(main())


def test_a_fetch_right_after_cancelling_a_job_that_is_parking_waits_for_the_cancel_to_land(
    tmp_path: Path,
) -> None:
    """A job has asked its question (input_required) and is still handing back its lease when the caller
    cancels: the cancel is recorded and lands with the park. A `fetch` with `wait_seconds` made in between
    waits for that (ms), instead of answering "input_required: answer q1" to a caller who just cancelled."""

    class Go(BaseModel):
        ok: bool

    async def main() -> None:
        jobs = Handles(config(tmp_path))
        park_may_land = threading.Event()

        @jobs.job(asks_input=True)
        async def asks(ctx: JobContext) -> bool:
            return (await ctx.ask("Go on?", Go)).ok

        async with rig(jobs) as r:
            repo = jobs.service.store.repo
            real_park = repo.park

            def held_park(job_id: str, owner: str) -> Any:
                park_may_land.wait(10)  # a worker thread: the park lands when the test says so
                return real_park(job_id, owner)

            repo.park = held_park  # type: ignore[method-assign]
            handle = (await r.ok("asks_start"))["handle"]
            asked = await r.ok("asks_progress", handle=handle, wait_seconds=5)
            assert asked["status"] == "input_required"
            cancelled = await r.ok("asks_cancel", handle=handle)
            assert cancelled["cancel_requested"] is True and cancelled["status"] == "input_required", (
                cancelled
            )
            fetch = asyncio.create_task(r.ok("asks_fetch", handle=handle, wait_seconds=10))
            await asyncio.sleep(0.3)
            assert not fetch.done(), "the fetch answered before the cancel landed"
            park_may_land.set()
            final = await fetch
            assert final["status"] == "cancelled", final
            no_wait = await r.ok("asks_fetch", handle=handle)
            assert no_wait["status"] == "cancelled"

    asyncio.run(main())
