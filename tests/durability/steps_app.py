"""A server whose durable steps a test kills mid-way: `python -m tests.durability.steps_app --port N`.

- `pipeline(repeatable)`: one durable step, `work`, declared safe to repeat or not, retried on interruption.
  Every run of the step appends `<job id> <attempt>` to `STEPS_RUNS_FILE`, then holds for
  `STEPS_HOLD_SECONDS` (on a worker thread: the process may be killed right there).

Configured by `HANDLES_*` (stateless Streamable HTTP, no tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

from mcp.server.mcpserver import MCPServer

from handles import Handles, JobContext, serve_http


def work(job_id: str, attempt: int) -> str:
    """The step: recorded as run, then held."""
    with open(os.environ["STEPS_RUNS_FILE"], "a") as runs:
        runs.write(f"{job_id} {attempt}\n")
        runs.flush()
        os.fsync(runs.fileno())
    time.sleep(float(os.environ.get("STEPS_HOLD_SECONDS", "0")))
    return f"worked in attempt {attempt}"


async def pipeline(ctx: JobContext, repeatable: bool) -> dict[str, Any]:
    """Run the one step `work`, safe to repeat or not, and say which attempt finished it."""
    done = await ctx.step("work", work, ctx.job_id, ctx.attempt, repeatable=repeatable)
    return {"step": done, "attempt": ctx.attempt}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.durability.steps_app")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    jobs = Handles()
    jobs.job(on_interrupt="retry", max_attempts=3)(pipeline)
    server: MCPServer[Any] = MCPServer("steps-app")
    jobs.bind(server)
    asyncio.run(serve_http(server, jobs, host="127.0.0.1", port=args.port))


if __name__ == "__main__":
    main()
