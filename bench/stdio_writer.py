"""What the official SDK's stdio transport costs a call, and a start: its writer as it is, and on the event loop.

The SDK's `stdio_server` writes every message on a worker thread (`anyio.wrap_file`: the write, then the flush,
each a thread hop). A worker thread needs the GIL to run, so while the event loop runs Python (a job's first
step, say) the reply waits in that thread. This script measures, over stdio against `python -m bench.app
--stdio`, with section 1's calls and rounds (`bench.overhead.measure_client`: each started job awaited
untimed after its call):

- `sdk`: the SDK as it is;
- `on-loop`: the same server with the SDK's stdout writer patched (in the server process only, bench only) to
  write and flush each message on the event loop (a message into a pipe is written at once unless the pipe is
  full): the change proposed upstream.

    python bench/stdio_writer.py [--rounds 500] [--root DIR ...]

Each `--root` is a checkout of this repository whose server is measured (default: this one), so two commits
can be compared side by side. Not a section of `bench/run.py`: it patches the SDK.
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


def serve_on_loop() -> None:
    """`python -m bench.app --stdio` with the SDK's stdout writer writing on the event loop."""
    import anyio
    import anyio.lowlevel
    import mcp.server.stdio as sdk_stdio
    from anyio import AsyncFile

    class OnLoop(AsyncFile):  # type: ignore[type-arg]
        async def write(self, text: str) -> int:
            written = self.wrapped.write(text)
            self.wrapped.flush()
            await anyio.lowlevel.checkpoint()
            return int(written)

        async def flush(self) -> None:
            await anyio.lowlevel.checkpoint()

    class Anyio:
        def __getattr__(self, name: str) -> object:
            return getattr(anyio, name)

        @staticmethod
        def wrap_file(file: object) -> object:
            return OnLoop(file) if file.writable() else anyio.wrap_file(file)  # type: ignore[attr-defined]

    sdk_stdio.anyio = Anyio()  # type: ignore[assignment]
    sys.path.insert(0, os.getcwd())
    sys.argv = ["bench.app", "--stdio"]
    runpy.run_module("bench.app", run_name="__main__")


async def measure(root: Path, on_loop: bool, rounds: int) -> dict[str, float]:
    """p50 of each of section 1's calls (`bench.overhead.measure_client`) against the stdio server of `root`."""
    from mcp import StdioServerParameters

    from bench.common import client, handles_env
    from bench.overhead import measure_client

    data_dir = Path(tempfile.mkdtemp(prefix="stdio-writer-"))
    args = [str(Path(__file__).resolve()), "--serve-on-loop"] if on_loop else ["-m", "bench.app", "--stdio"]
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
        for on_loop in (False, True):
            p50 = await measure(root, on_loop, rounds)
            base = p50["noop"]
            print(
                f"| {root} | {'on the event loop (patched)' if on_loop else 'the SDK (worker thread)'} "
                f"| {base * 1000:.2f} | {p50['work_start'] / base:.2f}x | {p50[TASKS_CREATE] / base:.2f}x "
                f"| {p50['work_progress'] / base:.2f}x |",
                flush=True,
            )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-on-loop"]:
        serve_on_loop()
    else:
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        parser.add_argument("--rounds", type=int, default=500)
        parser.add_argument("--root", type=Path, action="append", help="a checkout to measure (repeatable)")
        options = parser.parse_args()
        sys.path.insert(0, str(ROOT))
        asyncio.run(main([root.resolve() for root in options.root or [ROOT]], options.rounds))
