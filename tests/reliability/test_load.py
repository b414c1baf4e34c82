"""Load and soak on loopback: many concurrent jobs and polling clients against one server process.

Each simulated client loops until the deadline: it starts a job (handle tools or the Tasks face;
short jobs, longer jobs, a job that asks a question), polls at the server's `poll_after_ms`, answers,
fetches, and checks the result. Asserted: no error at all, every job ends as expected, the server's
memory and open file descriptors stay flat after warm-up, and p99 latency stays bounded. A second
test hammers `<job>_progress` far faster than `poll_after_ms` and counts database writes with the
audit triggers: polling a finished job writes nothing, polling a running one writes nothing beyond
the job's own heartbeats, and the abandonment keep-alive is throttled.

The quick version runs in the default suite (`LOAD_SECONDS`, default 10). The soak is marked `soak`
and deselected by default: `SOAK_SECONDS=600 pytest -m soak tests/reliability -s` (default 180 s).
Both print their figures as one JSON line; `RELIABILITY_REPORT=path` also appends it to a file.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer

from handles import Handles, HandlesConfig, JobContext
from tests.harness.relay import WireScanner
from tests.reliability.conftest import Deployment, codec, deploy, principal, token
from tests.reliability.support import RawReply, jobs_in_store, raw_call, report, write_count

TERMINAL = {"completed", "failed", "cancelled"}
PRINCIPALS = ["alice", "bob", "carol"]


@dataclass
class Figures:
    seconds: float = 0.0
    clients: int = 0
    requests: int = 0
    jobs: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    latency: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    samples: list[tuple[float, int, int]] = field(default_factory=list)  # (t, rss KiB, fds)

    def p(self, kind: str, q: float) -> float:
        values = sorted(self.latency[kind])
        return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0

    def summary(self) -> dict[str, Any]:
        everything = [v for values in self.latency.values() for v in values]
        overall = sorted(everything)
        return {
            "seconds": round(self.seconds, 1),
            "clients": self.clients,
            "requests": self.requests,
            "requests_per_second": round(self.requests / self.seconds, 1) if self.seconds else 0,
            "jobs": dict(self.jobs),
            "errors": len(self.errors),
            "p50_ms": round(1000 * statistics.median(overall), 1) if overall else 0,
            "p99_ms": round(1000 * overall[int(0.99 * (len(overall) - 1))], 1) if overall else 0,
            "p99_ms_by_kind": {kind: round(1000 * self.p(kind, 0.99), 1) for kind in sorted(self.latency)},
            "rss_mib": [
                round(rss / 1024, 1) for _, rss, _ in self.samples[:: max(1, len(self.samples) // 6)]
            ],
            "fds": [fds for _, _, fds in self.samples[:: max(1, len(self.samples) // 6)]],
        }


class LoadClient:
    def __init__(
        self,
        dep: Deployment,
        http: httpx2.AsyncClient,
        name: str,
        figures: Figures,
        scanner: WireScanner,
        ident: int,
    ) -> None:
        self.dep, self.http, self.name, self.figures, self.scanner, self.ident = (
            dep,
            http,
            name,
            figures,
            scanner,
            ident,
        )

    async def call(self, kind: str, method: str, params: dict[str, Any], declare: bool = True) -> RawReply:
        reply = await raw_call(
            self.http, self.dep.server.url, method, params, token=token(self.name), declare=declare
        )
        self.scanner.feed(self.ident, reply.raw.encode())
        self.scanner.close(self.ident)
        self.figures.requests += 1
        self.figures.latency[kind].append(reply.seconds)
        if reply.status != 200 or reply.body is None or "error" in reply.body:
            raise AssertionError(f"{kind}: HTTP {reply.status} {reply.raw[:300]}")
        return reply

    async def tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        kind = name.rsplit("_", 1)[-1] if "_" in name else "plain"
        reply = await self.call(kind, "tools/call", {"name": name, "arguments": arguments}, declare=False)
        body = reply.tool_body()
        if reply.result.get("isError") and body.get("status") not in TERMINAL:
            raise AssertionError(f"{name}: {body}")
        return body

    async def follow(self, job: str, handle: str, poll_ms: int) -> dict[str, Any]:
        while True:
            state = await self.tool(f"{job}_progress", {"handle": handle})
            if state["status"] in TERMINAL:
                return state
            if state["status"] == "input_required":
                await self.tool(
                    f"{job}_respond",
                    {"handle": handle, "responses": {"q1": {"approve": True, "note": "load"}}},
                )
                continue
            await asyncio.sleep((state["poll_after_ms"] or poll_ms) / 1000)

    async def one_job(self, rng: random.Random) -> None:
        choice = rng.random()
        if choice < 0.35:
            started = await self.tool("quick_start", {"x": 3})
            done = await self.tool("quick_fetch", {"handle": started["handle"], "wait_seconds": 5})
            assert done["result"] == {"steps": 3}, done
            self.figures.jobs["quick"] += 1
        elif choice < 0.65:
            seconds = rng.choice([0.3, 0.6, 1.0])
            started = await self.tool("slow_start", {"seconds": seconds})
            final = await self.follow("slow", started["handle"], started["poll_after_ms"])
            assert final["status"] == "completed", final
            done = await self.tool("slow_fetch", {"handle": started["handle"]})
            assert done["result"] == {"steps": 10}, done
            self.figures.jobs["slow"] += 1
        elif choice < 0.85:
            created = (
                await self.call("tools/call", "tools/call", {"name": "slow", "arguments": {"seconds": 0.3}})
            ).result
            task_id = created["taskId"]
            while True:
                task = (await self.call("tasks/get", "tasks/get", {"taskId": task_id})).result
                if task["status"] in TERMINAL:
                    break
                await asyncio.sleep(task.get("pollIntervalMs", 200) / 1000)
            assert task["status"] == "completed" and task["result"]["structuredContent"] == {"steps": 10}, (
                task
            )
            self.figures.jobs["task"] += 1
        else:
            started = await self.tool("approve_start", {"version": f"load-{rng.randrange(10**6)}"})
            final = await self.follow("approve", started["handle"], started["poll_after_ms"])
            assert final["status"] == "completed", final
            self.figures.jobs["approve"] += 1

    async def run(self, deadline: float, seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < deadline:
            try:
                await self.one_job(rng)
            except (AssertionError, httpx2.HTTPError, KeyError, TypeError) as exc:
                self.figures.errors.append(f"{type(exc).__name__}: {str(exc)[:300]}")


async def run_load(dep: Deployment, scanner: WireScanner, seconds: float, clients: int) -> Figures:
    figures = Figures(clients=clients)
    began = time.monotonic()
    deadline = began + seconds

    async def sample() -> None:
        while time.monotonic() < deadline + 1:
            figures.samples.append((time.monotonic() - began, dep.server.rss_kib(), dep.server.open_fds()))
            await asyncio.sleep(max(0.5, seconds / 60))

    limits = httpx2.Limits(max_connections=4, max_keepalive_connections=4)
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=60), limits=limits) as http:
        workers = [
            LoadClient(dep, http, PRINCIPALS[i % len(PRINCIPALS)], figures, scanner, 10_000 + i)
            for i in range(clients)
        ]
        await asyncio.gather(sample(), *(worker.run(deadline, seed=i) for i, worker in enumerate(workers)))
    figures.seconds = time.monotonic() - began
    return figures


def check(figures: Figures, dep: Deployment, *, p99_limit: float, rss_growth_mib: float) -> dict[str, Any]:
    summary = figures.summary()
    assert figures.errors == [], figures.errors[:5]
    assert sum(figures.jobs.values()) >= figures.clients, summary
    warm = [s for s in figures.samples if s[0] >= figures.seconds * 0.3]
    assert len(warm) >= 2, figures.samples
    rss = [r for _, r, _ in warm]
    fds = [f for _, _, f in warm]
    assert max(fds) - fds[0] <= 8, f"open file descriptors grew: {fds}"
    assert (max(rss[-3:]) - rss[0]) / 1024 <= rss_growth_mib, f"memory grew: {[r // 1024 for r in rss]} MiB"
    for kind in figures.latency:
        assert figures.p(kind, 0.99) <= p99_limit, f"p99 of {kind}: {figures.p(kind, 0.99):.3f} s ({summary})"
    unfinished = [job for job in jobs_in_store(dep.database_url) if job["status"] not in TERMINAL]
    assert unfinished == [], f"{len(unfinished)} jobs never ended"
    return summary


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory, scanner: WireScanner) -> Iterator[Deployment]:
    """A server of its own, so memory and descriptor figures are this load's alone."""
    with deploy(
        tmp_path_factory.mktemp("load"), scanner, HANDLES_LEASE_SECONDS="5", HANDLES_HEARTBEAT_SECONDS="1"
    ) as deployed:
        yield deployed


@pytest.mark.timeout(120)
async def test_quick_load_many_jobs_and_pollers_without_error_leak_or_slow_tail(
    loaded: Deployment, scanner: WireScanner
) -> None:
    seconds = float(os.environ.get("LOAD_SECONDS", "10"))
    figures = await run_load(loaded, scanner, seconds, clients=int(os.environ.get("LOAD_CLIENTS", "12")))
    report("quick_load", check(figures, loaded, p99_limit=1.5, rss_growth_mib=25))


@pytest.mark.soak
@pytest.mark.timeout(0)
async def test_soak_holds_for_minutes(loaded: Deployment, scanner: WireScanner) -> None:
    seconds = float(os.environ.get("SOAK_SECONDS", "180"))
    figures = await run_load(loaded, scanner, seconds, clients=int(os.environ.get("SOAK_CLIENTS", "24")))
    report("soak", check(figures, loaded, p99_limit=2.0, rss_growth_mib=40))


# -- polling faster than poll_after_ms ------------------------------------------------------------------


@pytest.mark.timeout(120)
async def test_polling_faster_than_poll_after_writes_nothing(loaded: Deployment) -> None:
    async with httpx2.AsyncClient(timeout=30) as http:

        async def tool(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
            reply = await raw_call(
                http,
                loaded.server.url,
                "tools/call",
                {"name": name, "arguments": arguments},
                token=token("alice"),
            )
            return reply.tool_body()

        async def hammer(job: str, handle: str, rounds: int) -> list[float]:
            took = []
            for _ in range(rounds):
                began = time.perf_counter()
                await tool(f"{job}_progress", {"handle": handle})
                await tool(f"{job}_fetch", {"handle": handle})
                await raw_call(http, loaded.server.url, "tasks/get", {"taskId": handle}, token=token("alice"))
                took.append((time.perf_counter() - began) / 3)
            return took

        finished = (await tool("quick_start", {"x": 1}))["handle"]
        await tool("quick_fetch", {"handle": finished, "wait_seconds": 5})
        finished_id = codec().verify(finished, principal=principal("alice")).job_id  # type: ignore[union-attr]
        before = write_count(loaded.database_url, finished_id)
        took = await hammer("quick", finished, 60)
        assert write_count(loaded.database_url, finished_id) == before, (
            "polling a finished job wrote to the database"
        )

        handle = (await tool("kept_start", {"seconds": 30}))["handle"]
        running_id = codec().verify(handle, principal=principal("alice")).job_id  # type: ignore[union-attr]
        await asyncio.sleep(0.5)
        quiet_start = write_count(loaded.database_url, running_id)
        await asyncio.sleep(2.0)
        quiet = write_count(loaded.database_url, running_id) - quiet_start
        busy_start = write_count(loaded.database_url, running_id)
        keep_alive_start = write_count(loaded.database_url, running_id, abandon_only=True)
        began = time.monotonic()
        took += await hammer("kept", handle, 100)
        busy_seconds = time.monotonic() - began
        busy = write_count(loaded.database_url, running_id) - busy_start
        keep_alive = write_count(loaded.database_url, running_id, abandon_only=True) - keep_alive_start
        # The job's own heartbeats keep writing; the polls add at most the throttled keep-alive (one
        # per quarter of abandon_after, here a minute).
        heartbeats_expected = quiet / 2.0 * busy_seconds
        assert busy <= heartbeats_expected * 1.5 + 3, (busy, quiet, busy_seconds)
        assert keep_alive <= 1, f"{keep_alive} keep-alive writes for 300 polls"
        await tool("kept_cancel", {"handle": handle})
    report(
        "polling_cost",
        {
            "polls": 480,
            "finished_job_writes": 0,
            "running_job_writes_while_hammered": busy,
            "running_job_writes_per_quiet_2s": quiet,
            "keep_alive_writes": keep_alive,
            "median_poll_ms": round(1000 * statistics.median(took), 2),
        },
    )


# -- what a long run would leak --------------------------------------------------------------------------


async def test_waiting_on_jobs_that_end_leaves_no_waiter_state_behind(tmp_path: Path) -> None:
    """Found by the soak: every job ever long-polled left an event in the notifier (memory grew per job)."""
    jobs = Handles(HandlesConfig(data_dir=tmp_path, secret_keys=("w" * 40,), max_active_per_principal=1000))

    @jobs.job
    async def brief(ctx: JobContext, x: int) -> int:
        await asyncio.sleep(0.01)
        return x

    server: MCPServer[Any] = MCPServer("waiters")
    jobs.bind(server)
    try:
        async with Client(server) as client:

            async def one(x: int) -> None:
                started = (await client.call_tool("brief_start", {"x": x})).structured_content
                assert started is not None
                await client.call_tool("brief_fetch", {"handle": started["handle"], "wait_seconds": 5})
                await client.call_tool("brief_progress", {"handle": started["handle"], "wait_seconds": 0.2})

            await asyncio.gather(*(one(x) for x in range(100)))
            notifier = jobs.service.store.notifier
            assert len(notifier._events) == len(notifier._past_reports) == 0, (
                "waiter state outlived its waiters"
            )
            assert notifier.watched() == {}
    finally:
        await jobs.aclose()
