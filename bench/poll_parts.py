"""Section 19: a progress poll over stdio split into its parts, each as a tool of its own beside the real one.

The bench server (`python -m bench.app --stdio` with `BENCH_POLL_PARTS=1`) gets, beside `noop`,
`progress_shaped` and `work_progress`, tools that each do one part more than the one before, all returning
the same prebuilt result of `work_progress`'s shape (`progress_shaped`'s):

- `shaped_async`: `progress_shaped` as an async function, with a `handle` argument (the SDK runs a sync tool on a
  worker thread; the package's tools are async).
- `poll_wrapped`: the package's tool wrapper with a prebuilt reply: the principal, the arguments, the reply made
  into a `CallToolResult` (`handle_tool`), without the argument gate.
- `poll_gated`: the same, behind the argument gate (`ArgumentGate`), as every generated tool is.
- `poll_read`: the handle checked and the job's snapshot read (`JobRepository.snapshot`), the reply prebuilt.
- `poll_opened`: `open_view` whole (the owner and keep-alive checks too), the reply prebuilt.
- `poll_built`: the real progress handler with its reply built at every poll (`ReplyMemo` of size 0), as a
  poll of a job that changed since the last poll builds it.
- `work_progress`: the real tool; the job does not change between polls, so each poll reuses the reply built
  for the last (change 50).

One client calls every tool once a round, in a fresh random order each round. Each row's "adds" is its p50
minus the p50 of the row before it.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Annotated, Any

from mcp_types import CallToolResult

from bench.common import (
    Options,
    Stats,
    Table,
    client,
    handles_stdio_server,
    log,
    quiet_gc,
    shuffled_rounds,
    structured,
)
from handles.server.bind_mcpserver import add_tools, handle_tool
from handles.server.handle_tools import JobTools
from handles.server.reply_memo import ReplyMemo
from handles.server.tool_shapes import ProgressOutput, ToolReply

SECTION = "poll_parts"
PARTS = (
    ("noop", "no-op plain tool (sync: the SDK's worker-thread hop)"),
    ("progress_shaped", "`progress_shaped`: the prebuilt result, sync, no argument"),
    ("shaped_async", "the same, async, with a `handle` argument"),
    ("poll_wrapped", "the package's tool wrapper, the reply prebuilt"),
    ("poll_gated", "+ the argument gate"),
    ("poll_read", "+ the handle checked and the snapshot read"),
    ("poll_opened", "+ `open_view`'s owner and keep-alive checks"),
    ("poll_built", "+ the reply built (a job changed since the last poll)"),
    ("work_progress", "`work_progress` of an unchanged job (the reply reused)"),
)


def add_poll_parts(server: Any, jobs: Any) -> None:
    """The tools of this section, on the bench server `server` (an `MCPServer`) of `jobs`."""
    from bench.app import progress_shaped_tool

    prebuilt = progress_shaped_tool(jobs)()
    reply = ToolReply(prebuilt.structured_content or {})
    service = jobs.service
    spec = jobs.specs["work"]
    definition = next(d for d in jobs.tool_definitions() if d.name == "work_progress")

    async def shaped_async(handle: str) -> Annotated[CallToolResult, ProgressOutput]:
        """The prebuilt result, async, with a handle argument."""
        return prebuilt

    async def canned(principal: str, arguments: dict[str, Any]) -> ToolReply:
        return reply

    async def read(principal: str, arguments: dict[str, Any]) -> ToolReply:
        claims = service.codec.verify(arguments["handle"], principal=principal)
        await service.store.read(service.store.repo.snapshot, claims.job_id)
        return reply

    async def opened(principal: str, arguments: dict[str, Any]) -> ToolReply:
        await service.open_view(spec, principal, arguments["handle"])
        return reply

    building = JobTools(spec, service)
    building._progress_replies = ReplyMemo(size=0)  # every poll builds its reply

    server.add_tool(shaped_async, structured_output=True)
    wrapped = dataclasses.replace(definition, name="poll_wrapped", handler=canned)
    server.add_tool(
        handle_tool(wrapped, jobs.principal_resolver).function, name=wrapped.name, structured_output=True
    )
    gated = [
        dataclasses.replace(definition, name=name, handler=handler)
        for name, handler in (
            ("poll_gated", canned),
            ("poll_read", read),
            ("poll_opened", opened),
            ("poll_built", building.progress),
        )
    ]
    add_tools(server, [handle_tool(definition, jobs.principal_resolver) for definition in gated])


async def measure(rounds: int, warmup: int) -> dict[str, list[float]]:
    data_dir = Path(tempfile.mkdtemp(prefix="poll-parts-"))
    params = handles_stdio_server(data_dir, BENCH_POLL_PARTS="1")
    async with client(params) as c:
        await c.list_tools()
        running = (await structured(c, "work_start", {"seconds": 3600}))["handle"]

        def call(name: str) -> Any:
            arguments = {} if name in ("noop", "progress_shaped") else {"handle": running}

            async def one() -> None:
                result = await c.call_tool(name, arguments)
                assert not result.is_error, result

            return one

        quiet_gc()
        return await shuffled_rounds({name: call(name) for name, _ in PARTS}, rounds, warmup)


async def run(options: Options) -> list[Table]:
    rounds = options.n(1500, 40)
    warmup = options.n(50, 5)
    log(f"poll_parts: stdio, {rounds} rounds")
    samples = await measure(rounds, warmup)
    table = options.table(
        SECTION,
        "19. A progress poll over stdio by parts (SQLite file, p50)",
        ["tool", "what it does", "p50 ms", "/ no-op", "adds (us)"],
    )
    stats = {name: Stats.of(samples[name]) for name, _ in PARTS}
    noop = stats["noop"].p50
    previous: float | None = None
    for name, what in PARTS:
        p50 = stats[name].p50
        table.data[name] = stats[name].as_dict()
        adds = "" if previous is None else f"{(p50 - previous) * 1000:+.0f}"
        table.rows.append([f"`{name}`", what, f"{p50:.3f}", f"{p50 / noop:.2f}x", adds])
        previous = p50
    table.notes += [
        f"{rounds} rounds after {warmup} not counted; one stdio client, every tool once a round in shuffled order. "
        "The job polled runs for an hour and reports nothing.",
        "Adds: the row's p50 minus the row before it. For `shaped_async` that is the worker-thread hop saved "
        "(the SDK runs a sync tool on a worker thread), for `work_progress` the reply reused instead of built.",
        "Every tool but `noop` returns a result of the same shape and schema, so the SDK's and the client's "
        "share of each is the same.",
    ]
    return [table]
