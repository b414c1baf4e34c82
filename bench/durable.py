"""Section 2: time to a durable handle, `work_start` latency on an SQLite file and on PostgreSQL.

`work_start` answers only once the job row is committed (the handle is minted after the insert),
so its latency is the time to a durable handle. Measured through the official client in-process
(the whole MCP tool path without a transport) and at the handler (`JobTools.start`, no MCP), in
alternation; after each start the job (0 s) is awaited, untimed, so starts do not overlap.
"""

from __future__ import annotations

import tempfile
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
    timed,
)

SECTION = "durable"


async def measure(data_dir: Path, database_url: str, n: int, warmup: int) -> dict[str, list[float]]:
    from handles.server.handle_tools import JobTools

    async with inprocess(data_dir, database_url) as (jobs, c):
        tools = JobTools(jobs.specs["work"], jobs.service)
        principal = "local:local"
        samples: dict[str, list[float]] = {"mcp": [], "handler": [], "noop": []}
        for index in range(warmup + n):
            elapsed, data = await timed(lambda: structured(c, "work_start", {"seconds": 0}))
            await structured(c, "work_fetch", {"handle": data["handle"], "wait_seconds": 10})
            direct, reply = await timed(lambda: tools.start(principal, {"seconds": 0}))
            assert not reply.is_error, reply.structured
            await structured(c, "work_fetch", {"handle": reply.structured["handle"], "wait_seconds": 10})
            base, _ = await timed(lambda: c.call_tool("noop", {}))
            if index >= warmup:
                samples["mcp"].append(elapsed)
                samples["handler"].append(direct)
                samples["noop"].append(base)
        return samples


async def run(options: Options) -> list[Table]:
    n = options.n(1000, 60)
    warmup = options.n(50, 10)
    table = Table(
        section=SECTION,
        title="2. Time to a durable handle: work_start latency by store",
        columns=["store", "path", "n", "p50 ms", "p90 ms", "p99 ms", "max ms"],
        command=options.section_command(SECTION),
    )
    stores: list[tuple[str, Any]] = [("SQLite file", "")]
    with postgres_schema(options.postgres_url, "durable") as pg_url:
        stores.append(("PostgreSQL", pg_url))
        for label, url in stores:
            if url is None:
                table.rows.append([label, "unreachable", 0, "n/a", "n/a", "n/a", "n/a"])
                continue
            log(f"durable: {label}, {n} starts")
            quiet_gc()
            data_dir = Path(tempfile.mkdtemp(prefix="durable-", dir=options.work_dir))
            samples = await measure(data_dir, url, n, warmup)
            table.data[label] = {}
            for path, key in (
                ("work_start via mcp.Client (in-process)", "mcp"),
                ("JobTools.start handler (no MCP)", "handler"),
                ("no-op plain tool via mcp.Client (reference)", "noop"),
            ):
                s = Stats.of(samples[key])
                table.data[label][key] = s.as_dict()
                table.rows.append([label, path, s.n, ms(s.p50), ms(s.p90), ms(s.p99), ms(s.maximum)])
    table.notes += [
        "SQLite: a file in WAL mode with synchronous=NORMAL (the defaults of handles' SQLite store): a commit "
        "is durable against a process crash, not against power loss before the next checkpoint.",
        "PostgreSQL: local server over TCP (127.0.0.1), psycopg 3, default synchronous_commit; each run works "
        "in a fresh schema.",
        "Each sample is one start of a 0 s job; the job is awaited (untimed) before the next start.",
    ]
    return [table]
