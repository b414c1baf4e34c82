"""Section 15: what a durable step costs, on an SQLite file and on PostgreSQL.

`ctx.step(name, fn)` records that the step starts (`JobRepository.begin_step`), runs `fn`, and records its
result (`finish_step`): two durable writes, each a transaction that checks the job's lease and touches the
job, so that a job resumed elsewhere replays what its steps returned instead of running them again. A job
of many steps pays them in every step.

A job (`stepping`, registered here only) runs `STEPS_PER_JOB` steps of an async function that returns a
small dict at once, and times each `await ctx.step(...)` on the server's event loop with nothing else running;
jobs run one after another.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.common import Options, Stats, Table, inprocess_with, log, sqlite_and_postgres, structured
from handles import JobContext

SECTION = "steps"
STEPS_PER_JOB = 50
_TIMES: dict[str, list[float]] = {}
"""Seconds each timed `ctx.step` took, by the mark of the job that timed it."""


async def _small() -> dict[str, Any]:
    """A step's function that returns at once (async: a plain function would add a worker thread's hop)."""
    return {"rows": 3, "source": "a fetched page"}


async def stepping(ctx: JobContext, steps: int = STEPS_PER_JOB, mark: str = "") -> dict[str, int]:
    """Run `steps` durable steps of a function that returns at once, timing each; keep the times by `mark`."""
    times = _TIMES.setdefault(mark, [])
    for index in range(steps):
        started = time.perf_counter()
        await ctx.step(f"part {index}", _small)
        times.append(time.perf_counter() - started)
    return {"steps": steps}


async def measure(data_dir: Path, database_url: str, jobs: int) -> list[float]:
    """Run `jobs` jobs of `STEPS_PER_JOB` steps one after another; each step's time, the first job's left out
    (its statements are compiled and its connections opened then)."""
    async with inprocess_with(stepping, data_dir, database_url) as (_, c):
        times: list[float] = []
        for index in range(jobs + 1):
            mark = f"{data_dir.name}-{index}"
            started = await structured(c, "stepping_start", {"mark": mark})
            fetched = await structured(c, "stepping_fetch", {"handle": started["handle"], "wait_seconds": 30})
            if fetched.get("status") != "completed":
                raise RuntimeError(f"a stepping job did not complete: {fetched}")
            recorded = _TIMES.pop(mark)
            if len(recorded) != STEPS_PER_JOB:
                raise RuntimeError(f"a stepping job timed {len(recorded)} steps, not {STEPS_PER_JOB}")
            if index > 0:
                times += recorded
        return times


async def run(options: Options) -> list[Table]:
    jobs = options.n(20, 2)
    table = options.table(
        SECTION,
        "15. A durable step: `await ctx.step(...)` of a function that returns at once (in-process)",
        ["store", "n", "p50 ms", "p90 ms", "p99 ms", "steps/s (one job)"],
    )
    with sqlite_and_postgres(options, SECTION, table) as stores:
        for label, url, data_dir in stores:
            log(f"steps: {label}, {jobs} jobs of {STEPS_PER_JOB} steps")
            s = Stats.of(await measure(data_dir, url, jobs))
            table.data[label] = s.as_dict()
            table.rows.append([label, s.n, *s.cells("p50", "p90", "p99"), f"{1000 / s.mean:.0f}"])
    table.notes += [
        f"Jobs of {STEPS_PER_JOB} steps run one after another, each started with `stepping_start` and awaited "
        "with `stepping_fetch`; the first job's steps are left out. A step is two durable writes (its start "
        "and its result), each checking the job's lease; steps/s is one over the mean.",
    ]
    return [table]
