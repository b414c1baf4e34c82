"""Caps: a per-principal cap on active jobs, and a global cap that queues extra jobs."""

from __future__ import annotations

import asyncio
from pathlib import Path

from handles import Handles, JobContext

from .harness import config, rig


def test_per_principal_cap_refuses_with_a_clear_error_until_a_job_ends(tmp_path: Path) -> None:
    async def main() -> None:
        release = asyncio.Event()
        jobs = Handles(config(tmp_path, max_active_per_principal=2))

        @jobs.job
        async def hold(ctx: JobContext) -> int:
            await release.wait()
            return 1

        async with rig(jobs) as r:
            first = (await r.ok("hold_start"))["handle"]
            await r.ok("hold_start")
            body, is_error = await r.call("hold_start")
            assert is_error and body["error"] == "limit_reached", body
            assert body["limit"] == 2 and body["retryable"] is True
            assert "2" in body["message"] and "cancel" in body["next"]
            await r.ok("hold_cancel", handle=first)
            await r.ok("hold_fetch", handle=first, wait_seconds=5)
            third = await r.ok("hold_start")
            assert third["created"] is True
            release.set()

    asyncio.run(main())


def test_global_cap_queues_extra_jobs_in_working_with_a_queued_message(tmp_path: Path) -> None:
    async def main() -> None:
        release = asyncio.Event()
        running: list[int] = []
        jobs = Handles(config(tmp_path, max_running=1))

        @jobs.job
        async def one_at_a_time(ctx: JobContext, n: int) -> int:
            running.append(n)
            await release.wait()
            return n

        async with rig(jobs) as r:
            first = await r.ok("one_at_a_time_start", n=1)
            await r.ok("one_at_a_time_progress", handle=first["handle"], wait_seconds=2)
            second = await r.ok("one_at_a_time_start", n=2)
            assert second["status"] == "working"
            assert "Queued" in second["status_message"] and "busy" in second["status_message"]
            await asyncio.sleep(0.3)
            assert running == [1], "the second job waits for a free worker"
            release.set()
            done = await r.ok("one_at_a_time_fetch", handle=second["handle"], wait_seconds=10)
            assert done["status"] == "completed" and done["result"] == {"result": 2}
            assert running == [1, 2]

    asyncio.run(main())
