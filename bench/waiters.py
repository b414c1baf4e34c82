"""Section 9: many open long-polls on one node (SQLite file): event-loop lag and store statements per second.

N queued jobs (on a node that runs no workers, so nothing changes them) each get one waiter, the
long-poll at the heart of `<job>_progress` / `<job>_fetch` with `wait_seconds` (`JobOperations.wait`,
without the MCP layer, so that N can reach 10,000 on one process). While they wait, a probe task
sleeps 1 ms in a loop and records how late it wakes (the event-loop lag every other request on the
node would see), and every SQL statement the store runs is counted.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Options, Stats, Table, handles_config, log

SECTION = "waiters"


async def measure(data_dir: Path, waiters: int, seconds: float) -> dict[str, Any]:
    from sqlalchemy import event

    from bench.app import create_jobs

    jobs = create_jobs(handles_config(data_dir, run_workers=False, max_active_per_principal=100))
    async with jobs.running():
        service = jobs.service
        spec = jobs.specs["work"]
        records = []
        for index in range(waiters):
            started = await service.start(spec, f"local:p{index // 90}", {"seconds": 0.0}, None)
            records.append(started.job)
        repo = service.store.repo
        statements = 0

        def count(*_: object) -> None:
            nonlocal statements
            statements += 1

        engines = [engine for engine in (repo._read_engine, repo.engine, repo._inline_engine) if engine]
        for engine in engines:
            event.listen(engine, "before_cursor_execute", count)
        tasks = [
            asyncio.create_task(service.wait(record, 600, lambda j: j.status == "completed"))
            for record in records
        ]
        try:
            await asyncio.sleep(2.0)  # every waiter has read its job once and waits
            before = statements
            lags: list[float] = []
            began = time.perf_counter()
            while time.perf_counter() - began < seconds:
                tick = time.perf_counter()
                await asyncio.sleep(0.001)
                lags.append(max(time.perf_counter() - tick - 0.001, 0.0))
            per_second = (statements - before) / (time.perf_counter() - began)
            alive = sum(not task.done() for task in tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for engine in engines:
                event.remove(engine, "before_cursor_execute", count)
    return {"lag": Stats.of(lags), "statements_per_second": per_second, "waiting": alive}


async def run(options: Options) -> list[Table]:
    sizes = [1000] if options.quick else [1000, 3200, 10000]
    seconds = 3.0 if options.quick else 10.0
    table = options.table(
        SECTION,
        "9. Open long-polls on one node (SQLite file): event-loop lag and store statements per second",
        ["long-polls", "still waiting", "lag p50 ms", "lag p99 ms", "lag max ms", "SQL statements/s"],
    )
    for waiters in sizes:
        log(f"waiters: {waiters} long-polls for {seconds:g} s")
        data_dir = Path(tempfile.mkdtemp(prefix="waiters-", dir=options.work_dir))
        result = await measure(data_dir, waiters, seconds)
        lag: Stats = result["lag"]
        table.rows.append(
            [
                waiters,
                result["waiting"],
                *lag.cells("p50", "p99", "maximum"),
                f"{result['statements_per_second']:.0f}",
            ]
        )
        table.data[str(waiters)] = {
            "lag": lag.as_dict(),
            "statements_per_second": result["statements_per_second"],
        }
    table.notes += [
        "Lag: how much later than asked a 1 ms sleep on the node's event loop wakes, sampled back to back while "
        "every long-poll waits (what any other request on that node waits for the loop).",
        "Store poll interval: `store_poll_seconds` = 1 s (the default). Each waiter reads its job once when it "
        "starts waiting; afterwards the runtime reads the versions of all watched jobs once per interval "
        "(in batches of 500 ids) and wakes the waiters whose job changed.",
    ]
    return [table]
