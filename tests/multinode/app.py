"""A job application for the multi-node tests: every run of `count_me` appends a line to a file."""

from __future__ import annotations

import asyncio
import os

from handles import Handles, JobContext


def create_jobs() -> Handles:
    jobs = Handles()

    @jobs.job
    async def count_me(ctx: JobContext, n: int) -> int:
        with open(os.environ["MULTINODE_RUNS_FILE"], "a") as runs:
            runs.write(f"{ctx.job_id} {os.getpid()}\n")
        await asyncio.sleep(0.01)
        return n

    return jobs
