"""Section 4: scale of the store. `work_progress` (and `work_start`, `work_fetch`) latency with 10^3, 10^5
and 10^6 stored jobs.

The job table is seeded directly in bulk, in SQL (a recursive CTE on SQLite, `generate_series` on
PostgreSQL): completed jobs of the same kind and the same principal as the benchmark client (the
worst case for per-principal queries), with a stored result, expiring in 6 hours. The database
grows in place from one size to the next; at each size a fresh server instance (cold pools) starts
one running and one completed job and the calls are measured in shuffled rounds with the no-op tool.
"""

from __future__ import annotations

from pathlib import Path

from bench.common import (
    Options,
    Stats,
    Table,
    inprocess,
    log,
    ms,
    quiet_gc,
    ratio,
    seeded_to,
    shuffled_rounds,
    sqlite_and_postgres,
    structured,
    verdict,
)
from tests.harness.seed import count_jobs

SECTION = "store_scale"
FLAT_TARGET = 1.2


async def measure(data_dir: Path, database_url: str, rounds: int, warmup: int) -> dict[str, list[float]]:
    async with inprocess(data_dir, database_url) as (_jobs, c):
        running = (await structured(c, "work_start", {"seconds": 3600}))["handle"]
        done = (await structured(c, "work_start", {"seconds": 0}))["handle"]
        await structured(c, "work_fetch", {"handle": done, "wait_seconds": 10})
        started: list[str] = []

        async def start() -> None:
            started.append((await structured(c, "work_start", {"seconds": 0}))["handle"])

        calls = {
            "noop": lambda: c.call_tool("noop", {}),
            "work_progress": lambda: structured(c, "work_progress", {"handle": running}),
            "work_fetch": lambda: structured(c, "work_fetch", {"handle": done}),
            "work_start": start,
        }

        async def finish_started() -> None:
            while started:
                await structured(c, "work_fetch", {"handle": started.pop(), "wait_seconds": 10})

        samples = await shuffled_rounds(calls, rounds, warmup, finish_started)
        await structured(c, "work_cancel", {"handle": running})
        return samples


async def run(options: Options) -> list[Table]:
    sizes = [1_000, 10_000] if options.quick else [1_000, 100_000, 1_000_000]
    rounds = options.n(600, 60)
    warmup = options.n(40, 10)
    table = options.table(
        SECTION,
        "4. Scale of the store: latency by number of stored jobs",
        [
            "store",
            "stored jobs",
            "seed s",
            "work_progress p50 / p99 ms",
            "progress p50 vs smallest",
            "progress / no-op vs smallest",
            "work_fetch p50 / p99 ms",
            "work_start p50 / p99 ms",
            "start p50 vs smallest",
            "no-op p50 ms",
            f"progress flat (<= {FLAT_TARGET}x)",
        ],
    )
    with sqlite_and_postgres(options, "scale", table, sqlite_url=True) as stores:
        for label, url, data_dir in stores:
            # Create the schema first (a server instance does it), then grow the table in place.
            async with inprocess(data_dir, url):
                pass
            base_progress = base_start = base_relative = None
            table.data[label] = {}
            for size in sizes:
                seconds = seeded_to(url, size, f"store_scale: {label}")
                quiet_gc()
                log(f"store_scale: {label}, {size} jobs, {rounds} rounds")
                samples = await measure(data_dir, url, rounds, warmup)
                stats = {name: Stats.of(values) for name, values in samples.items()}
                progress, start = stats["work_progress"], stats["work_start"]
                relative = progress.p50 / stats["noop"].p50  # the host's pace taken out (same rounds)
                if base_progress is None:
                    base_progress, base_start, base_relative = progress, start, relative
                assert base_start is not None and base_relative is not None
                flat = progress.p50 / base_progress.p50 <= FLAT_TARGET
                table.data[label][size] = {name: s.as_dict() for name, s in stats.items()} | {
                    "seed_s": seconds
                }
                table.rows.append(
                    [
                        label,
                        f"{count_jobs(url):,}",
                        f"{seconds:.1f}",
                        progress.p50_p99,
                        ratio(progress.p50, base_progress.p50),
                        f"{relative / base_relative:.2f}x",
                        stats["work_fetch"].p50_p99,
                        start.p50_p99,
                        ratio(start.p50, base_start.p50),
                        ms(stats["noop"].p50),
                        verdict(flat) if size != sizes[0] else "(base)",
                    ]
                )
    table.notes += [
        "Seeded jobs are completed, of kind `work`, and belong to the benchmark's own principal; `stored jobs` "
        "counts every row at measurement time (the seed plus the jobs the measurements started).",
        "Latencies through the official client in-process (no transport), so the store's share is as large "
        "as it gets; the target is judged on the work_progress p50 ratio.",
        "No ANALYZE is run after seeding (as in a deployment that never runs one).",
        "progress / no-op vs smallest: work_progress's p50 over the no-op's p50 of the same rounds, against the "
        "same at the smallest size. The no-op touches no store, so when it slows as much as the progress poll "
        "does (the host, or the database server's own work after a seed, on the same cores), this stays at "
        "1.00x; the target is still judged on the progress p50 ratio itself.",
    ]
    return [table]
