"""A progress poll of a job that has not changed since the last poll gets the reply built then; any change
the caller would see (a progress report, a step, its status, its questions) builds a new one, and another
principal's poll of the job is refused before any reply is looked at."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from handles import Handles, JobContext
from handles.server.reply_memo import ReplyMemo

from .harness import config, rig

pytestmark = pytest.mark.timeout(60)


class Go(BaseModel):
    ok: bool


def built_replies(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the jobs whose progress reply was built (not reused), in order."""
    built: list[str] = []
    put = ReplyMemo.put

    def counting(self: ReplyMemo[Any], job_id: str, state: object, reply: Any) -> None:
        built.append(job_id)
        put(self, job_id, state, reply)

    monkeypatch.setattr(ReplyMemo, "put", counting)
    return built


async def test_an_unchanged_job_gets_its_last_reply_and_every_change_a_new_one(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = Handles(config(tmp_path, database_url=database_url, auto_migrate=True))
    reported, stepped = asyncio.Event(), asyncio.Event()
    go_report, go_step, go_ask = (asyncio.Event() for _ in range(3))

    async def nothing() -> int:
        return 1

    @jobs.job(asks_input=True)
    async def following(ctx: JobContext) -> str:
        await go_report.wait()
        await ctx.progress(5, 10, "halfway")
        await ctx.flush()
        reported.set()
        await go_step.wait()
        await ctx.step("one", nothing)
        stepped.set()
        await go_ask.wait()
        answer = await ctx.ask("Go on?", Go)
        return "went" if answer.ok else "stopped"

    built = built_replies(monkeypatch)
    async with rig(jobs) as r:
        handle = (await r.ok("following_start"))["handle"]
        await asyncio.sleep(0.2)
        first = await r.ok("following_progress", handle=handle)
        again = await r.ok("following_progress", handle=handle)
        assert again == first and len(built) == 1, (built, first, again)

        go_report.set()
        await asyncio.wait_for(reported.wait(), 10)
        shown = await r.ok("following_progress", handle=handle)
        assert shown["progress"]["done"] == 5 and shown["status_message"] == "halfway", shown
        assert len(built) == 2
        assert await r.ok("following_progress", handle=handle) == shown and len(built) == 2

        go_step.set()
        await asyncio.wait_for(stepped.wait(), 10)
        shown = await r.ok("following_progress", handle=handle)
        assert [step["name"] for step in shown["steps"]] == ["one"] and len(built) == 3, shown

        go_ask.set()
        waiting = await r.ok("following_progress", handle=handle, wait_seconds=10)
        assert waiting["status"] == "input_required" and waiting["input_requests"], waiting
        await r.ok("following_progress", handle=handle)
        assert len(built) == 3, "a job waiting for answers is not remembered: its questions are read apart"

        await r.ok("following_respond", handle=handle, responses={"q1": {"ok": True}})
        done = await r.ok("following_fetch", handle=handle, wait_seconds=10)
        assert done["status"] == "completed" and done["result"] == {"result": "went"}, done
        ended = await r.ok("following_progress", handle=handle)
        assert ended["status"] == "completed" and ended["poll_after_ms"] is None, ended
        assert await r.ok("following_progress", handle=handle) == ended and len(built) == 4


async def test_a_lease_renewal_alone_keeps_the_last_reply(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal moves only the lease's expiry, which a caller never sees while the node is alive."""
    settings = {"lease_seconds": 30.0, "heartbeat_seconds": 0.05}
    jobs = Handles(config(tmp_path, database_url=database_url, auto_migrate=True, **settings))
    release = asyncio.Event()

    @jobs.job
    async def held(ctx: JobContext) -> int:
        await release.wait()
        return 1

    built = built_replies(monkeypatch)
    async with rig(jobs) as r:
        handle = (await r.ok("held_start"))["handle"]
        await asyncio.sleep(0.2)
        first = await r.ok("held_progress", handle=handle)
        await asyncio.sleep(0.5)  # about ten renewals
        again = await r.ok("held_progress", handle=handle)
        assert again == first and len(built) == 1, (built, first, again)
        release.set()


async def test_another_principals_poll_of_a_remembered_job_looks_like_a_made_up_handle(
    tmp_path: Path,
) -> None:
    """The reply is looked up only after the poll has checked the caller's handle and principal."""
    jobs = Handles(config(tmp_path))
    release = asyncio.Event()

    @jobs.job
    async def held(ctx: JobContext) -> int:
        await release.wait()
        return 1

    progress = next(d for d in jobs.tool_definitions() if d.name == "held_progress").handler
    start = next(d for d in jobs.tool_definitions() if d.name == "held_start").handler
    async with jobs.running():
        handle = (await start("local:alice", {})).structured["handle"]
        alices = await progress("local:alice", {"handle": handle})
        assert alices.structured["status"] == "working", alices.structured
        assert (await progress("local:alice", {"handle": handle})) is alices  # remembered
        bobs = await progress("local:bob", {"handle": handle})
        made_up = await progress("local:bob", {"handle": handle[:-4] + "AAAA"})
        assert bobs.is_error and bobs.structured == made_up.structured, (bobs.structured, made_up.structured)
        release.set()
