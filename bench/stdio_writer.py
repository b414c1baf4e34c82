"""What the official SDK's stdio writer costs a call, and a start: `serve_stdio`'s writer against the SDK's.

The SDK's `stdio_server` writes every message on a worker thread (`anyio.wrap_file`: the write, then the flush,
each a thread hop). A worker thread needs the GIL to run, so while the event loop runs Python (a job's first
step, say) the reply waits in that thread. Since change 35 `serve_stdio` writes an `MCPServer`'s replies on
the event loop instead (handles/server/stdio_stdout.py). This script measures, over stdio against `python -m
bench.app --stdio`, with section 1's calls and rounds (`bench.overhead.measure_client`: each started job
awaited untimed after its call), each server two ways, in turn:

- `sdk`: `serve_stdio` made to serve with the SDK's own `run_stdio_async` (its writer on a worker thread), in the
  server process only, bench only: what every tree before change 35 serves with;
- `as-is`: the server as the tree serves it (for a tree before change 35, the SDK's writer again).

    python bench/stdio_writer.py [--rounds 500] [--root DIR ...]

Each `--root` is a checkout of this repository whose server is measured (default: this one), so two commits
can be compared side by side. Not a section of `bench/run.py`: it patches the server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import runpy
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def serve_with_sdk_writer() -> None:
    """`python -m bench.app --stdio` with `serve_stdio` serving through the SDK's own `run_stdio_async`."""
    sys.path.insert(0, os.getcwd())
    from handles.server import serving

    if hasattr(serving, "_stdio_serving"):  # change 35 and later: an MCPServer is served by handles' writer

        def sdk_serving(server: object) -> object:
            return server.run_stdio_async()  # type: ignore[attr-defined]

        serving._stdio_serving = sdk_serving  # type: ignore[assignment]
    sys.argv = ["bench.app", "--stdio"]
    runpy.run_module("bench.app", run_name="__main__")


async def measure(root: Path, sdk_writer: bool, rounds: int) -> dict[str, float]:
    """p50 of each of section 1's calls (`bench.overhead.measure_client`) against the stdio server of `root`."""
    from mcp import StdioServerParameters

    from bench.common import client, handles_env
    from bench.overhead import measure_client

    data_dir = Path(tempfile.mkdtemp(prefix="stdio-writer-"))
    args = (
        [str(Path(__file__).resolve()), "--serve-sdk-writer"]
        if sdk_writer
        else ["-m", "bench.app", "--stdio"]
    )
    env = handles_env(data_dir) | {"PYTHONPATH": str(root)}
    params = StdioServerParameters(command=sys.executable, args=args, env=env, cwd=str(root))
    async with client(params) as c:
        samples = await measure_client(c, rounds, 30)
    return {name: statistics.median(values) for name, values in samples.items()}


async def main(roots: list[Path], rounds: int) -> None:
    from bench.overhead import TASKS_CREATE

    print(
        "| server | stdout writer | no-op p50 ms | work_start / no-op | Tasks create / no-op | work_progress / no-op |"
    )
    print("|---|---|---|---|---|---|")
    for root in roots:
        for sdk_writer in (True, False):
            p50 = await measure(root, sdk_writer, rounds)
            base = p50["noop"]
            print(
                f"| {root} | {'the SDK (worker thread; patched in)' if sdk_writer else 'as the tree serves'} "
                f"| {base * 1000:.2f} | {p50['work_start'] / base:.2f}x | {p50[TASKS_CREATE] / base:.2f}x "
                f"| {p50['work_progress'] / base:.2f}x |",
                flush=True,
            )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-sdk-writer"]:
        serve_with_sdk_writer()
    else:
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        parser.add_argument("--rounds", type=int, default=500)
        parser.add_argument("--root", type=Path, action="append", help="a checkout to measure (repeatable)")
        options = parser.parse_args()
        sys.path.insert(0, str(ROOT))
        asyncio.run(main([root.resolve() for root in options.root or [ROOT]], options.rounds))
