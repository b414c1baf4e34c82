"""Cancel never lies: a job is not reported `cancelled` while a step it started still runs (item 4)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from handles import Handles, JobContext
from handles.server.tasks_extension import detailed_task
from handles.states import Status
from tests.durability.harness import Rig, config, rig

from .support import stored, stored_steps


async def _cancelled_while_its_step_runs(r: Rig, job: str, running: threading.Event) -> str:
    """Start `job`, wait until its step has set `running`, and ask for the job's cancel; its handle."""
    handle = str((await r.ok(f"{job}_start"))["handle"])
    assert await asyncio.to_thread(running.wait, 10), "the step never started"
    await r.ok(f"{job}_cancel", handle=handle)
    return handle


def test_cancel_waits_for_a_running_sync_step_and_records_it(tmp_path: Path) -> None:
    async def main() -> None:
        jobs = Handles(config(tmp_path, cancel_grace_seconds=0.2))
        effects: list[float] = []
        # The step runs until the test lets it end (not for a fixed time a loaded machine can outrun).
        running, release = threading.Event(), threading.Event()

        def charge() -> str:
            running.set()
            release.wait(30)
            effects.append(time.time())
            return "charged"

        @jobs.job
        async def payment(ctx: JobContext) -> str:
            await ctx.step("charge", charge)
            await asyncio.sleep(30)
            return "done"

        async with rig(jobs) as r:
            try:
                handle = await _cancelled_while_its_step_runs(r, "payment", running)
                await asyncio.sleep(0.6)  # past the grace period, the step still runs
                assert stored(jobs, handle).status == Status.WORKING.value
            finally:
                release.set()
            final = await r.ok("payment_fetch", handle=handle, wait_seconds=10)
            assert final["status"] == "cancelled"
            record = stored(jobs, handle)
            assert effects and record.finished_at is not None
            assert effects[0] <= record.finished_at.timestamp()
            assert stored_steps(jobs, handle)["charge"].status == "completed"

    asyncio.run(main())


def test_a_step_outliving_the_hard_limit_is_marked_unknown_on_both_faces(tmp_path: Path) -> None:
    async def main() -> None:
        jobs = Handles(config(tmp_path, cancel_grace_seconds=0.1, step_cancel_limit_seconds=0.4))

        # The step hangs until the test lets it end, after the hard limit has been judged.
        running, release, ended = threading.Event(), threading.Event(), threading.Event()

        def hang() -> str:
            running.set()
            release.wait(30)
            ended.set()
            return "late"

        @jobs.job
        async def migration(ctx: JobContext) -> str:
            await ctx.step("migrate", hang)
            return "done"

        async with rig(jobs) as r:
            try:
                handle = await _cancelled_while_its_step_runs(r, "migration", running)
                final = await r.ok("migration_fetch", handle=handle, wait_seconds=10)
                assert final["status"] == "cancelled"
                assert "migrate" in final["status_message"] and "unknown" in final["status_message"]
                assert "reconcile" in final["next"].lower()
                assert stored_steps(jobs, handle)["migrate"].status == "unknown"
                record = stored(jobs, handle)
                task = detailed_task(jobs.specs["migration"], record, handle, [])
                assert task["status"] == "cancelled" and "reconcile" in task["statusMessage"].lower()
                assert record.error is not None and record.error["data"]["reason"] == "step_unknown"
            finally:
                release.set()
            # The thread ends later: nothing it does changes the stored truth.
            assert await asyncio.to_thread(ended.wait, 10)
            await asyncio.sleep(0.5)
            assert stored_steps(jobs, handle)["migrate"].status == "unknown"
            assert stored(jobs, handle).status == Status.CANCELLED.value

    asyncio.run(main())
