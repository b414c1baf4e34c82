"""Retention, input timeouts, ttl and abandonment, driven by an injected clock and explicit sweeps."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from handles import Handles, JobContext

from .harness import FakeClock, config, rig


class Answer(BaseModel):
    ok: bool


def declare(jobs: Handles, release: asyncio.Event) -> None:
    @jobs.job(retention=timedelta(hours=2), keep_result_for=timedelta(minutes=10))
    async def quick(ctx: JobContext, n: int) -> int:
        return n * 2

    @jobs.job(retention=timedelta(hours=2), asks_input=True, input_timeout=timedelta(minutes=5))
    async def asks(ctx: JobContext) -> bool:
        answer = await ctx.ask("Go on?", Answer)
        return answer.ok

    @jobs.job(retention=timedelta(minutes=30))
    async def slow(ctx: JobContext) -> int:
        await release.wait()
        return 1

    @jobs.job(retention=timedelta(hours=2), abandon_after=timedelta(minutes=3))
    async def forgettable(ctx: JobContext) -> int:
        await release.wait()
        return 1


def _run(tmp: Path, scenario: Any) -> None:
    async def main() -> None:
        clock = FakeClock()
        jobs = Handles(config(tmp), clock=clock)
        release = asyncio.Event()
        async with rig(jobs, lambda j: declare(j, release)) as r:
            await scenario(r, jobs, clock)

    asyncio.run(main())


def test_finished_result_is_kept_for_keep_result_for_then_expires(tmp_path: Path) -> None:
    async def scenario(r: Any, jobs: Handles, clock: FakeClock) -> None:
        handle = (await r.ok("quick_start", n=21))["handle"]
        assert (await r.ok("quick_fetch", handle=handle, wait_seconds=5))["result"] == {"result": 42}
        clock.advance(minutes=9)
        assert (await jobs.runtime.sweep_once())["deleted"] == 0
        assert (await r.ok("quick_fetch", handle=handle))["status"] == "completed"
        clock.advance(minutes=2)
        assert (await jobs.runtime.sweep_once())["deleted"] == 1
        body, is_error = await r.call("quick_fetch", handle=handle)
        assert is_error and body["error"] == "expired_handle", body
        assert "10 minutes" in body["message"] and "quick_start" in body["next"]

    _run(tmp_path, scenario)


def test_expired_handle_is_decided_from_its_own_signed_time(tmp_path: Path) -> None:
    async def scenario(r: Any, jobs: Handles, clock: FakeClock) -> None:
        handle = (await r.ok("quick_start", n=1))["handle"]
        await r.ok("quick_fetch", handle=handle, wait_seconds=5)
        clock.advance(hours=2, seconds=1)  # past the retention signed into the handle; nothing swept yet
        body, is_error = await r.call("quick_progress", handle=handle)
        assert is_error and body["error"] == "expired_handle" and "expired at" in body["message"], body

    _run(tmp_path, scenario)


def test_unanswered_question_ends_the_job_after_input_timeout(tmp_path: Path) -> None:
    async def scenario(r: Any, jobs: Handles, clock: FakeClock) -> None:
        handle = (await r.ok("asks_start"))["handle"]
        state = await r.ok("asks_fetch", handle=handle, wait_seconds=5)
        assert state["status"] == "input_required"
        clock.advance(minutes=4)
        assert (await jobs.runtime.sweep_once())["timed_out"] == 0
        clock.advance(minutes=2)
        assert (await jobs.runtime.sweep_once())["timed_out"] == 1
        body, is_error = await r.call("asks_fetch", handle=handle, wait_seconds=5)
        assert is_error and body["status"] == "failed"
        assert body["error"]["data"]["reason"] == "input_timeout"
        assert "No answer" in body["status_message"]
        late, _ = await r.call("asks_respond", handle=handle, responses={"q1": {"ok": True}})
        assert late["accepted"] == [] and late["ignored"] == ["q1"] and late["status"] == "failed"

    _run(tmp_path, scenario)


def test_active_job_past_its_retention_is_stopped_and_removed(tmp_path: Path) -> None:
    async def scenario(r: Any, jobs: Handles, clock: FakeClock) -> None:
        handle = (await r.ok("slow_start"))["handle"]
        await r.ok("slow_progress", handle=handle, wait_seconds=1)
        clock.advance(minutes=31)
        counts = await jobs.runtime.sweep_once()
        # ended and, being past its retention, deleted in the same pass
        assert counts["timed_out"] == 1 and counts["deleted"] == 1
        await asyncio.sleep(0.2)
        assert jobs.runtime.running_ids() == [], "the local run was stopped"
        body, is_error = await r.call("slow_progress", handle=handle)
        assert is_error and body["error"] == "expired_handle"

    _run(tmp_path, scenario)


def test_job_nobody_polls_is_cancelled_after_abandon_after(tmp_path: Path) -> None:
    async def scenario(r: Any, jobs: Handles, clock: FakeClock) -> None:
        watched = (await r.ok("forgettable_start"))["handle"]
        forgotten = (await r.ok("forgettable_start"))["handle"]
        for _ in range(3):
            clock.advance(minutes=1, seconds=30)
            await r.ok("forgettable_progress", handle=watched)  # keeps it alive
        counts = await jobs.runtime.sweep_once()
        assert counts["abandoned"] == 1
        final = await r.ok("forgettable_fetch", handle=forgotten, wait_seconds=5)
        assert final["status"] == "cancelled"
        assert final["status_message"].startswith("Cancelled by the server, since nobody had followed it")
        assert (await r.ok("forgettable_progress", handle=watched))["status"] == "working"

    _run(tmp_path, scenario)
