"""A short database outage while a job's process knows what happened: its writes wait the outage out.

PostgreSQL is reached through a TCP relay that the test takes down (every connection cut, new ones refused)
for a few seconds, shorter than a lease: the step's outcome, the progress report and the job's outcome that
meet the outage are written once the database is back, and the job completes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from handles import Handles, JobContext
from tests.harness.relay import Relay

from .harness import config, rig

OUTAGE_SECONDS = 3.0


def declare_tests(jobs: Handles, *, reached: asyncio.Event, go_on: asyncio.Event, before_step: bool) -> None:
    """`deploy`: its step `test` sets `reached` and waits for `go_on` (with `before_step`, the job does that
    just before the step begins instead)."""

    async def run_tests() -> dict[str, Any]:
        if not before_step:
            reached.set()
            await go_on.wait()
        return {"passed": 12}

    @jobs.job(on_interrupt="retry", max_attempts=3)
    async def deploy(ctx: JobContext) -> dict[str, Any]:
        if before_step:
            reached.set()
            await go_on.wait()
        report = await ctx.step("test", run_tests)
        await ctx.progress(1, 2, "tested")
        await ctx.step("release", lambda: "v2")
        return {"tests": report, "attempt": ctx.attempt}


@pytest.mark.parametrize("before_step", [False, True], ids=["step-finishes", "step-begins"])
def test_a_step_written_during_an_outage_completes(
    tmp_path: Path, postgres_url: str, before_step: bool
) -> None:
    """The step finishes (or begins) while the database is cut: its write waits the outage out, and the job
    completes at its first attempt, every step recorded once."""
    relay = Relay(5432, http=False).up()

    async def main() -> None:
        reached, go_on = asyncio.Event(), asyncio.Event()
        url = relay.database_url(postgres_url)
        jobs = Handles(
            config(
                tmp_path,
                database_url=url,
                auto_migrate=True,
                lease_seconds=3 * OUTAGE_SECONDS,  # the lease outlasts the outage
                heartbeat_seconds=0.2,
                sweep_interval_seconds=0.3,
            )
        )
        async with rig(
            jobs, lambda j: declare_tests(j, reached=reached, go_on=go_on, before_step=before_step)
        ) as r:
            begun = await r.ok("deploy_start")
            await asyncio.wait_for(reached.wait(), 10)
            relay.down()
            go_on.set()  # the step's write meets the outage
            await asyncio.sleep(OUTAGE_SECONDS)
            relay.up()
            result = await r.ok("deploy_fetch", handle=begun["handle"], wait_seconds=30)
            assert result["status"] == "completed", result
            assert result["result"] == {"tests": {"passed": 12}, "attempt": 1}
            progress = await r.ok("deploy_progress", handle=begun["handle"])
            assert [(s["name"], s["status"], s["attempt"]) for s in progress["steps"]] == [
                ("test", "completed", 1),
                ("release", "completed", 1),
            ]

    try:
        asyncio.run(main())
    finally:
        relay.close()
