"""Section 3: pickup and wake on one node.

- pickup: from the moment `work_start` is called to the first line of the job function
  (and, for reference, from the moment `work_start` answered; negative when the job was
  already running before the answer reached the client).
- wake: a client waits in a long-poll (`work_fetch` / `work_progress` with `wait_seconds=10`);
  the job function then returns; wake is the time from its return to the long-poll's answer
  (the outcome write, the local notification, the re-read and the reply).

In-process (`mcp.Client(server)`), so the job function and the client share one clock.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    Options,
    Stats,
    Table,
    inprocess,
    log,
    ms,
    postgres_schema,
    quiet_gc,
    structured,
    verdict,
)

SECTION = "pickup"
PICKUP_TARGET_MS = 5.0
WAKE_TARGET_MS = 20.0


async def _until_started(mark: str, timeout: float = 10.0) -> None:
    from bench.app import STARTED

    deadline = time.perf_counter() + timeout
    while mark not in STARTED:
        if time.perf_counter() > deadline:
            raise TimeoutError(f"job {mark} never started")
        await asyncio.sleep(0.0005)


async def measure(data_dir: Path, database_url: str, n: int, warmup: int) -> dict[str, list[float]]:
    from bench.app import FINISHED, STARTED, gate

    samples: dict[str, list[float]] = {
        "pickup_call": [],
        "pickup_answer": [],
        "wake_fetch": [],
        "wake_progress": [],
    }
    async with inprocess(data_dir, database_url) as (_jobs, c):
        tag = data_dir.name
        for index in range(warmup + n):
            mark = f"{tag}-p{index}"
            called = time.perf_counter()
            data = await structured(c, "work_start", {"seconds": 0, "mark": mark})
            answered = time.perf_counter()
            await structured(c, "work_fetch", {"handle": data["handle"], "wait_seconds": 10})
            if index >= warmup:
                samples["pickup_call"].append(STARTED[mark] - called)
                samples["pickup_answer"].append(STARTED[mark] - answered)

            for tool in ("work_fetch", "work_progress"):
                mark = f"{tag}-w{tool}{index}"
                handle = (await structured(c, "work_start", {"seconds": -1, "mark": mark}))["handle"]
                await _until_started(mark)
                await asyncio.sleep(0.002)  # let the job's "running" writes settle before the waiter parks
                returned: list[float] = []

                async def waiter(
                    tool: str = tool, handle: str = handle, returned: list[float] = returned
                ) -> Any:
                    if tool == "work_progress":
                        version_seen = await structured(c, tool, {"handle": handle})
                        assert version_seen["status"] == "working"
                    data = await structured(c, tool, {"handle": handle, "wait_seconds": 10})
                    returned.append(time.perf_counter())
                    return data

                task = asyncio.create_task(waiter())
                await asyncio.sleep(0.03)  # the long-poll is parked by now
                gate(mark).set()
                data = await task
                if tool == "work_fetch":
                    assert data["status"] == "completed", data
                if index >= warmup:
                    key = "wake_fetch" if tool == "work_fetch" else "wake_progress"
                    samples[key].append(returned[0] - FINISHED[mark])
                await structured(c, "work_fetch", {"handle": handle, "wait_seconds": 10})
    return samples


async def run(options: Options) -> list[Table]:
    n = options.n(300, 25)
    warmup = options.n(20, 5)
    table = Table(
        section=SECTION,
        title="3. Pickup and wake (one node, in-process client)",
        columns=["store", "measure", "n", "p50 ms", "p90 ms", "p99 ms", "target (p50)", "holds"],
        command=options.section_command(SECTION),
    )
    with postgres_schema(options.postgres_url, "pickup") as pg_url:
        for label, url in (("SQLite file", ""), ("PostgreSQL", pg_url)):
            if url is None:
                table.rows.append([label, "PostgreSQL unreachable", 0, "n/a", "n/a", "n/a", "", "n/a"])
                continue
            log(f"pickup: {label}, {n} rounds")
            quiet_gc()
            data_dir = Path(tempfile.mkdtemp(prefix="pickup-", dir=options.work_dir))
            samples = await measure(data_dir, url, n, warmup)
            table.data[label] = {}
            for key, what, target in (
                ("pickup_call", "pickup: work_start called -> job function running", PICKUP_TARGET_MS),
                ("pickup_answer", "(job function running - work_start answered)", None),
                ("wake_fetch", "wake: job returned -> waiting work_fetch answers", WAKE_TARGET_MS),
                ("wake_progress", "wake: job returned -> waiting work_progress answers", WAKE_TARGET_MS),
            ):
                s = Stats.of(samples[key])
                table.data[label][key] = s.as_dict()
                holds = None if target is None else s.p50 < target
                table.rows.append(
                    [
                        label,
                        what,
                        s.n,
                        ms(s.p50),
                        ms(s.p90),
                        ms(s.p99),
                        f"< {target:g} ms" if target else "",
                        verdict(holds),
                    ]
                )
    table.notes += [
        "Pickup includes the whole work_start call (validation, the durable insert, the handle); with a free "
        "worker slot the job is inserted already leased to the local runtime (claim at insert), so no separate "
        "claim write is needed; the job function starts a few turns of the event loop after the start has answered "
        "(its reply goes first), and this in-process client, on the same loop, takes its reply in those turns.",
        "Wake includes the job's outcome write (a compare-and-set transition), the in-process notification, "
        "the waiter's re-read and the reply through the MCP client.",
        "Across nodes a waiter wakes through PostgreSQL LISTEN/NOTIFY, else within store_poll_seconds (1 s); "
        "section 7 measures the cross-node wake.",
    ]
    return [table]
