"""Section 14: a progress poll by what the job's durable steps returned, on an SQLite file and on PostgreSQL.

A poll shows each step's name, status, attempt and times, never its result. Three running jobs of one kind
(`stepped`, registered here only, so the other sections' server is unchanged): one with no steps, one
with five steps that each returned about 1 KB of JSON, one with five that each returned about 200 KB.
Each is polled with `stepped_progress` through the official client in-process, in shuffled rounds with
the no-op tool, so the ratios to the no-op are what to compare across runs and hosts. If a poll read its
steps' results, the last row would cost in proportion to them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.common import (
    Options,
    Stats,
    Table,
    inprocess_with,
    log,
    shuffled_rounds,
    sqlite_and_postgres,
    structured,
)
from handles import JobContext

SECTION = "steps_poll"
STEPS = 5
JOBS = {"no steps": (0, 0), "5 steps, 1 KB each": (STEPS, 1), "5 steps, 200 KB each": (STEPS, 200)}
"""Label -> (steps, kilobytes of JSON each step returns)."""


def _returned(kilobytes: int) -> dict[str, Any]:
    """About `kilobytes` KB of JSON: rows of numbers and text, as a step that fetched data returns."""
    row = {"id": 123456, "name": "row of a fetched table", "amount": 1234.5}  # about 64 bytes as JSON
    return {"rows": [row] * (kilobytes * 16)}


async def stepped(ctx: JobContext, steps: int = 0, kilobytes: int = 0, mark: str = "") -> dict[str, int]:
    """Record `steps` durable steps, each returning about `kilobytes` KB, then wait until cancelled."""
    for index in range(steps):
        await ctx.step(f"fetch part {index}", _returned, kilobytes)
    await ctx.progress(steps, steps + 1, f"{steps} steps recorded; waiting")
    from bench.app import gate

    await gate(mark).wait()
    return {"steps": steps}


async def measure(data_dir: Path, database_url: str, rounds: int, warmup: int) -> dict[str, list[float]]:
    from bench.app import gate

    async with inprocess_with(stepped, data_dir, database_url) as (_, c):
        handles: dict[str, str] = {}
        for label, (steps, kilobytes) in JOBS.items():
            started = await structured(
                c, "stepped_start", {"steps": steps, "kilobytes": kilobytes, "mark": f"poll-{label}"}
            )
            handles[label] = started["handle"]
            progress: dict[str, Any] = {}
            for _ in range(200):  # until its steps are recorded
                progress = await structured(
                    c, "stepped_progress", {"handle": handles[label], "wait_seconds": 1}
                )
                if progress["progress"].get("done") == steps:
                    break
            assert len(progress["steps"]) == steps, progress

        def poll(handle: str) -> Any:
            return lambda: structured(c, "stepped_progress", {"handle": handle})

        calls = {label: poll(handle) for label, handle in handles.items()}
        calls["no-op"] = lambda: c.call_tool("noop", {})
        try:
            return await shuffled_rounds(calls, rounds, warmup)
        finally:
            for label in JOBS:
                gate(f"poll-{label}").set()


async def run(options: Options) -> list[Table]:
    rounds = options.n(400, 40)
    warmup = options.n(40, 5)
    table = options.table(
        SECTION,
        "14. A progress poll by what the job's steps returned (in-process client)",
        ["store", "job", "n", "p50 ms", "p90 ms", "p50 / no-op"],
    )
    with sqlite_and_postgres(options, SECTION, table) as stores:
        for label, url, data_dir in stores:
            log(f"steps_poll: {label}, {rounds} rounds")
            samples = await measure(data_dir, url, rounds, warmup)
            noop = Stats.of(samples["no-op"])
            table.data[label] = {}
            for job in (*JOBS, "no-op"):
                s = Stats.of(samples[job])
                table.data[label][job] = s.as_dict()
                table.rows.append([label, job, s.n, *s.cells("p50", "p90"), f"{s.p50 / noop.p50:.2f}x"])
    table.notes += [
        "Each job is running (its steps recorded, waiting to be released) while it is polled; every poll "
        "answers at once (no wait_seconds). The three polls and the no-op tool run once a round, in a fresh "
        "random order each round.",
        "A step's result here is a list of 64-byte rows as JSON: about 1 KB, or about 200 KB, for each of the "
        "five steps. A poll's reply is the same size for all three but the steps it lists.",
    ]
    return [table]
