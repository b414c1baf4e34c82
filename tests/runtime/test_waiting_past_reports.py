"""A fetch waits for a job's status to move: it sleeps through what a running job reports on its way (its
progress reports, its durable steps' starts and outcomes), written on its own node or on another, and is not
woken, nor does it read the job again, for any of them. A progress long-poll, which shows those reports,
still wakes for each; the fetch wakes when the job ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer

from handles import Handles, JobContext
from tests.durability.harness import config
from tests.harness.waiting import until
from tests.runtime.support import job_id_of

pytestmark = pytest.mark.timeout(90)

STEPS = 30


class Script:
    """What the test lets the job do, and when: its steps and progress, then one more step, then its end."""

    def __init__(self) -> None:
        self.go, self.stepped, self.more, self.finish = (asyncio.Event() for _ in range(4))


def declare(jobs: Handles, script: Script) -> None:
    async def nothing(index: int) -> int:
        return index

    @jobs.job
    async def stepping(ctx: JobContext) -> int:
        await script.go.wait()
        for index in range(STEPS):
            await ctx.step(f"s{index}", nothing, index)
            await ctx.progress(index + 1, STEPS)
        await ctx.flush()
        script.stepped.set()
        await script.more.wait()
        await ctx.step("last", nothing, -1)
        await script.finish.wait()
        return STEPS


def counted_reads(jobs: Handles, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the jobs `jobs` reads whole (`JobRepository.get`: what a waiter reads when woken), in order."""
    repo = jobs.service.store.repo
    get = repo.get
    reads: list[str] = []

    def counting(job_id: str) -> Any:
        reads.append(job_id)
        return get(job_id)

    monkeypatch.setattr(repo, "get", counting)
    return reads


@asynccontextmanager
async def client_of(jobs: Handles, stack: AsyncExitStack) -> AsyncIterator[Client]:
    server: MCPServer[Any] = MCPServer("waiting")
    jobs.bind(server)
    stack.push_async_callback(jobs.aclose)
    async with Client(server) as client:
        yield client


async def waits_past_reports(
    runner: Client, running: Handles, waiter: Client, waiting: Handles, script: Script, reads: list[str]
) -> None:
    """Start on `runner` (whose node is `running`); fetch and watch progress on `waiter` (whose node is
    `waiting`, its reads `reads`)."""
    started = (await runner.call_tool("stepping_start", {})).structured_content
    assert started is not None
    handle = started["handle"]
    job_id = job_id_of(handle)
    # The job runs before the fetch waits. A start is stored queued, not claimed at once, while the node
    # knows of work waiting before it (on PostgreSQL, a "queued" notice from any other node of its
    # deployment sets that); the dispatcher's claim then moves its status, which wakes a fetch: a move,
    # not a report.
    await until(lambda: job_id in running.runtime.running_ids(), "the job runs")
    watched = waiting.service.store.notifier.watched
    fetch = asyncio.create_task(waiter.call_tool("stepping_fetch", {"handle": handle, "wait_seconds": 60}))
    await until(lambda: job_id in watched(), "the fetch waits")
    before = len(reads)

    script.go.set()
    await asyncio.wait_for(script.stepped.wait(), 30)
    await asyncio.sleep(0.3)  # what the last reports woke has run by now
    assert reads[before:] == [], f"the waiting fetch read the job {len(reads) - before} times for its reports"
    assert not fetch.done(), fetch.result()

    poll = await waiter.call_tool("stepping_progress", {"handle": handle})
    assert poll.structured_content is not None
    shown = {step["name"] for step in poll.structured_content["steps"]}
    assert len(shown) == STEPS and poll.structured_content["progress"]["done"] == STEPS
    progress = asyncio.create_task(
        waiter.call_tool("stepping_progress", {"handle": handle, "wait_seconds": 60})
    )
    # Both wait now: the fetch since before the steps, the long-poll once it holds its event (it then reads
    # the job, so a step landing between the two still ends its wait).
    await until(lambda: job_id in waiting.service.store.notifier._events, "the progress long-poll waits")
    script.more.set()
    woken = await asyncio.wait_for(progress, 20)  # by the step alone: the job still works
    assert woken.structured_content is not None
    assert woken.structured_content["status"] == "working"
    assert "last" in {step["name"] for step in woken.structured_content["steps"]}
    assert not fetch.done(), fetch.result()

    script.finish.set()
    fetched = await asyncio.wait_for(fetch, 20)
    assert fetched.structured_content is not None
    assert fetched.structured_content["status"] == "completed"
    assert fetched.structured_content["result"] == {"result": STEPS}


async def test_a_waiting_fetch_sleeps_through_its_jobs_reports(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = Handles(config(tmp_path, database_url=database_url, store_poll_seconds=30, auto_migrate=True))
    script = Script()
    declare(jobs, script)
    reads = counted_reads(jobs, monkeypatch)
    async with AsyncExitStack() as stack:
        client = await stack.enter_async_context(client_of(jobs, stack))
        await waits_past_reports(client, jobs, client, jobs, script, reads)


async def test_a_waiting_fetch_on_another_node_sleeps_through_the_reports_it_hears(
    postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node a runs the job; node b, polling the store only every 30 s, serves the fetch and the progress
    long-poll: b hears a's reports through PostgreSQL's notices (`reported`), and its end (`changed`)."""
    runner = Handles(
        config(tmp_path / "a", database_url=postgres_url, store_poll_seconds=30, auto_migrate=True)
    )
    waiting = Handles(
        config(
            tmp_path / "b",
            database_url=postgres_url,
            store_poll_seconds=30,
            run_workers=False,
            auto_migrate=True,
        )
    )
    script = Script()
    declare(runner, script)
    declare(waiting, Script())
    reads = counted_reads(waiting, monkeypatch)
    async with AsyncExitStack() as stack:
        on_a = await stack.enter_async_context(client_of(runner, stack))
        on_b = await stack.enter_async_context(client_of(waiting, stack))
        await runner.start()
        await waiting.start()

        async def listening() -> None:
            """Until b's listener hears a notice (one a third node sends for a job of its own)."""
            heard = waiting.service.store.notifier.watch("probe")
            while not heard.is_set():
                runner.service.store.repo.publish("probe", "a-third-node")
                await asyncio.sleep(0.1)

        await asyncio.wait_for(listening(), 20)
        await waits_past_reports(on_a, runner, on_b, waiting, script, reads)
