"""Section 17: does a start grow slower as its principal's jobs pile up on one server?

One server (its pooled connections live as long as it does) starts 0 s jobs of one principal in section 2's
loop (the start timed at the handler, its job awaited, a no-op MCP call) on an SQLite file and on
PostgreSQL, each in a fresh store, and reports the handler's p50 by block of starts: the first block's
against the last. A start counts its principal's active jobs; a count whose plan read every job the
principal had stored (ended ones too) made every start slower than the one before (migration 0012).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from bench.common import Options, Table, inprocess, log, sqlite_and_postgres, structured, timed

SECTION = "start_drift"
PRINCIPAL = "local:local"


async def measure(data_dir: Path, database_url: str, n: int) -> list[float]:
    from handles.server.handle_tools import JobTools

    samples: list[float] = []
    async with inprocess(data_dir, database_url) as (jobs, c):
        tools = JobTools(jobs.specs["work"], jobs.service)
        for _ in range(n):
            elapsed, reply = await timed(lambda: tools.start(PRINCIPAL, {"seconds": 0}))
            assert not reply.is_error, reply.structured
            await structured(c, "work_fetch", {"handle": reply.structured["handle"], "wait_seconds": 10})
            await c.call_tool("noop", {})
            samples.append(elapsed)
    return samples


async def run(options: Options) -> list[Table]:
    n = options.n(4000, 600)
    blocks = 8 if not options.quick else 3
    size = n // blocks
    table = options.table(
        SECTION,
        f"17. A start by how many its principal made before it, on one server ({n} starts, p50 ms by block)",
        [
            "store",
            *[f"starts {i * size + 1}-{(i + 1) * size}" for i in range(blocks)],
            "last / first",
        ],
    )
    with sqlite_and_postgres(options, SECTION, table) as stores:
        for name, url, data_dir in stores:
            log(f"start_drift: {name}")
            samples = await measure(data_dir, url, n)
            p50s = [statistics.median(samples[i * size : (i + 1) * size]) for i in range(blocks)]
            table.rows.append([name, *[f"{p * 1000:.3f}" for p in p50s], f"{p50s[-1] / p50s[0]:.2f}x"])
            table.data[name] = {"p50_by_block_ms": [p * 1000 for p in p50s], "n": n}
    table.notes += [
        "`JobTools.start` of a 0 s job of one principal, timed at the handler (no MCP); after each start its job "
        "is awaited (`work_fetch`, untimed) and a no-op MCP call made, as in section 2. Each store is fresh, "
        "and PostgreSQL's table is never analysed during the run (autovacuum's first pass comes later).",
        "Flat means a start costs the same whatever its principal stored before it; a row that climbs block "
        "by block is a start that reads its principal's history.",
    ]
    return [table]
