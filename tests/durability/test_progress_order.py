"""Progress writes land in the order they were made: a report the job makes later is never overwritten by an
earlier one still on its way to the database (a flush while a delayed write is at the database)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from handles import Handles, JobContext
from tests.harness.waiting import until

from .harness import config, rig

pytestmark = pytest.mark.timeout(60)


async def test_a_flush_while_a_delayed_write_is_at_the_database_keeps_the_latest_progress(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job reports 29, which is written later (the flush interval has not passed), and that write is
    slow to commit. It then reports 30 and flushes: the stored progress must be 30 when the job goes on,
    and stay 30 after the slow write of 29 has ended."""
    jobs = Handles(
        config(tmp_path, database_url=database_url, progress_flush_seconds=0.05, auto_migrate=True)
    )
    flushed, finish = asyncio.Event(), asyncio.Event()
    writing_29, wrote_29 = threading.Event(), threading.Event()

    @jobs.job
    async def reporting(ctx: JobContext) -> int:
        await ctx.progress(28, 30)  # written at once: the next report waits for the flush interval
        await ctx.progress(29, 30)  # written by the trailing write, some 50 ms later
        await until(writing_29.is_set, "the delayed write of 29 is at the database")
        await ctx.progress(30, 30)
        await ctx.flush()
        flushed.set()
        await finish.wait()
        return 30

    repo = jobs.service.store.repo
    set_progress = repo.set_progress

    def slow_for_29(job_id: str, owner: str, done: float | None, *rest: Any) -> bool:
        if done == 29:
            writing_29.set()
            time.sleep(0.5)  # the database is slow to take this one write
            try:
                return set_progress(job_id, owner, done, *rest)
            finally:
                wrote_29.set()
        return set_progress(job_id, owner, done, *rest)

    monkeypatch.setattr(repo, "set_progress", slow_for_29)
    async with rig(jobs) as r:
        handle = (await r.ok("reporting_start"))["handle"]
        await asyncio.wait_for(flushed.wait(), 20)
        shown = await r.ok("reporting_progress", handle=handle)
        assert shown["progress"]["done"] == 30, shown["progress"]
        await until(wrote_29.is_set, "the slow write of 29 has ended")
        shown = await r.ok("reporting_progress", handle=handle)
        assert shown["progress"]["done"] == 30, f"an earlier report overwrote the latest: {shown['progress']}"
        finish.set()
        done = await r.ok("reporting_fetch", handle=handle, wait_seconds=20)
        assert done["status"] == "completed"
