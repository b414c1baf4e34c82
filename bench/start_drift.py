"""Section 17: does a start grow slower as its principal's jobs pile up on one server?

One server (its pooled connections live as long as it does) takes, in turn, a start of one principal that
keeps starting and a start of a principal new each time, 0 s jobs on an SQLite file and on PostgreSQL, each
in a fresh store. Each start is timed at the handler and its job awaited (untimed), then a no-op MCP call is
made, as in section 2. Taken in turn, both kinds of start meet the same moment of the machine, so their
ratio by block shows what the principal's history costs, apart from the drift of the host itself. A start
counts its principal's active jobs; a count whose plan read every job the principal had stored (ended ones
too) made every start slower than the one before (migration 0012).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from bench.common import Options, Table, inprocess, log, sqlite_and_postgres, timed

SECTION = "start_drift"
PRINCIPAL = "local:local"


async def measure(data_dir: Path, database_url: str, n: int) -> tuple[list[float], list[float]]:
    """The handler's time of each start of the one principal, and of each new principal's start."""
    from handles.server.handle_tools import JobTools

    kept: list[float] = []
    new: list[float] = []
    async with inprocess(data_dir, database_url) as (jobs, c):
        tools = JobTools(jobs.specs["work"], jobs.service)
        for i in range(n):
            for principal, samples in ((PRINCIPAL, kept), (f"local:new-{i}", new)):
                elapsed, reply = await timed(lambda who=principal: tools.start(who, {"seconds": 0}))
                assert not reply.is_error, reply.structured
                fetched = await tools.fetch(
                    principal, {"handle": reply.structured["handle"], "wait_seconds": 10}
                )
                assert fetched.structured.get("status") == "completed", fetched.structured
                await c.call_tool("noop", {})
                samples.append(elapsed)
    return kept, new


async def run(options: Options) -> list[Table]:
    n = options.n(4000, 600)
    blocks = 8 if not options.quick else 3
    size = n // blocks
    table = options.table(
        SECTION,
        f"17. A start by how many its principal made before it, on one server ({n} starts of one principal "
        "and of a new principal each, in turn; p50 ms by block)",
        [
            "store",
            "principal",
            *[f"starts {i * size + 1}-{(i + 1) * size}" for i in range(blocks)],
            "last / first",
            "last block / new principal's",
        ],
    )
    with sqlite_and_postgres(options, SECTION, table) as stores:
        for name, url, data_dir in stores:
            log(f"start_drift: {name}")
            kept, new = await measure(data_dir, url, n)
            p50s = {
                who: [statistics.median(samples[i * size : (i + 1) * size]) for i in range(blocks)]
                for who, samples in (("one principal", kept), ("a new one each", new))
            }
            for who, row in p50s.items():
                last_against_new = (
                    f"{row[-1] / p50s['a new one each'][-1]:.2f}x" if who == "one principal" else ""
                )
                table.rows.append(
                    [
                        name,
                        who,
                        *[f"{p * 1000:.3f}" for p in row],
                        f"{row[-1] / row[0]:.2f}x",
                        last_against_new,
                    ]
                )
            table.data[name] = {
                who: {"p50_by_block_ms": [p * 1000 for p in row]} for who, row in p50s.items()
            }
            table.data[name]["n"] = n
    table.notes += [
        "`JobTools.start` of a 0 s job, timed at the handler (no MCP); after each start its job is awaited "
        "(`JobTools.fetch`, untimed) and a no-op MCP call made, as in section 2. The two principals' starts "
        "alternate. Each store is fresh, and PostgreSQL's table is never analysed during the run "
        "(autovacuum's first pass comes later).",
        "The last column is the one to read: the one principal's start in the last block against a new "
        "principal's start at the same time. Near 1.00x means a start costs the same whatever its principal "
        "stored before it; the `last / first` columns move with the host as well.",
    ]
    return [table]
