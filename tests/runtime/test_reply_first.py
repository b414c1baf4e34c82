"""A start's reply goes before its job's first step (issue 14, change 26).

A job stored claimed by the process that started it is handed to the runtime at once; its run now waits
`REPLY_FIRST_TURNS` turns of the event loop, so the start's reply, on its way out through the same loop,
is not held behind the job's first stretch of Python (for a short job, its whole run up to the outcome
write). Each test drives the real `Handles` on an SQLite file.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Literal

import pytest

from handles import Handles, JobContext
from handles.runtime import executor, job_runner
from handles.states import Status
from tests.durability.harness import config, rig

from .support import job_id_of, quick_jobs, settled, start_as, stored


def test_the_start_returns_before_its_job_takes_its_first_step(tmp_path: Path) -> None:
    async def main() -> None:
        jobs, began = quick_jobs(tmp_path)
        try:
            handle = await start_as(jobs, "alice", "quick")
            assert began == [], "the job's first step ran before its start returned"
            assert stored(jobs, handle).status == Status.WORKING.value
            assert (await settled(jobs, handle)).status == Status.COMPLETED.value
            assert len(began) == 1
        finally:
            await jobs.aclose()

    asyncio.run(main())


def test_an_mcp_client_has_the_start_reply_before_the_job_begins(tmp_path: Path, database_url: str) -> None:
    """On both stores: on PostgreSQL the job is handed over from the insert's shielded task, a turn of the
    loop further from the reply than on an SQLite file, where the insert runs in the handler itself."""

    async def main() -> None:
        order: list[str] = []

        def declare(jobs: Handles) -> None:
            @jobs.job
            async def quick(ctx: JobContext) -> str:
                order.append("job")
                return "done"

        async with rig(Handles(config(tmp_path, database_url=database_url, auto_migrate=True)), declare) as r:
            handle = (await r.ok("quick_start"))["handle"]
            order.append("reply")
            final = await r.ok("quick_fetch", handle=handle, wait_seconds=10)
            assert final["status"] == "completed"
            assert order == ["reply", "job"]

    asyncio.run(main())


def test_a_plain_call_s_job_lets_no_reply_go_first_its_caller_waits_for_its_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain call's reply is the job's own result: its job starts at once. A start's job still lets the
    start's reply go first."""
    turned: list[str] = []
    reply_first = executor.Runtime._reply_first

    async def spied(self: executor.Runtime, entry: Any, record: Any) -> bool:
        turned.append(record.id)
        return await reply_first(self, entry, record)

    monkeypatch.setattr(executor.Runtime, "_reply_first", spied)

    async def main() -> None:
        def declare(jobs: Handles) -> None:
            @jobs.job
            async def quick(ctx: JobContext) -> str:
                return "done"

        async with rig(Handles(config(tmp_path)), declare) as r:
            plain = await r.client.call_tool("quick", {})
            assert not plain.is_error and plain.structured_content == {"result": "done"}, plain
            assert turned == [], "the plain call's job waited for a reply that was its own result"
            handle = (await r.ok("quick_start"))["handle"]
            assert (await r.ok("quick_fetch", handle=handle, wait_seconds=10))["status"] == "completed"
            assert turned == [job_id_of(handle)]

    asyncio.run(main())


def test_an_awaited_start_runs_its_job_before_it_returns_and_hands_over_its_outcome(tmp_path: Path) -> None:
    async def main() -> None:
        jobs, began = quick_jobs(tmp_path)
        try:
            outcome = asyncio.get_running_loop().create_future()
            started = await jobs.service.start(jobs.specs["quick"], "alice", {}, None, settled=outcome)
            assert began == [started.job.id], "the job's first step waited although its caller waits for it"
            status, values = await asyncio.wait_for(outcome, 5)
            stored_job = await settled(jobs, started.handle)
            assert status.value == stored_job.status == Status.COMPLETED.value
            assert values["result"] == stored_job.result
        finally:
            await jobs.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("on_interrupt", ["retry", "fail"])
def test_a_job_stopped_before_its_first_step_is_handed_over_and_runs_once(
    tmp_path: Path, on_interrupt: Literal["retry", "fail"], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever its interrupt policy: a job that never ran here was not interrupted, so it goes back to the
    queue for any node, as `Runtime.adopt` sends back a job it cannot run."""

    async def main() -> None:
        # The stop's own path may wait on worker threads (the dispatcher's query in flight, say), longer
        # than eight turns of the loop take: the turns are widened here so that the stop lands in them.
        monkeypatch.setattr(job_runner, "REPLY_FIRST_TURNS", 200_000)
        first, began = quick_jobs(tmp_path, on_interrupt, drain_seconds=0, lease_seconds=30)
        handle = await start_as(first, "alice", "quick")
        await first.aclose()  # before the job's first step
        record = stored(first, handle)
        assert began == [] and record.status == Status.WORKING.value and record.lease_owner is None

        monkeypatch.undo()  # the node that takes it over runs it as any node does
        second, began_there = quick_jobs(tmp_path, on_interrupt, lease_seconds=30)
        await second.start()
        try:
            assert (await settled(second, handle)).status == Status.COMPLETED.value
        finally:
            await second.aclose()
        assert began == [] and len(began_there) == 1, "the job ran once, on the node that took it over"

    asyncio.run(main())


def test_a_job_whose_cancel_runs_out_of_grace_before_its_first_step_ends_cancelled_without_running(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        jobs, began = quick_jobs(tmp_path, cancel_grace_seconds=0)
        try:
            handle = await start_as(jobs, "alice", "quick")
            job_id = stored(jobs, handle).id
            assert jobs.runtime.signal_cancel(job_id), "the job is held here, before its first step"
            record = await settled(jobs, handle)
            assert record.status == Status.CANCELLED.value, record.status_message
            assert began == [], "a job cancelled before its first step never runs"
        finally:
            await jobs.aclose()

    asyncio.run(main())
