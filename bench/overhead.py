"""Section 1: overhead against the bare call, on the same server, client and transport.

For each transport (in-process, stdio, Streamable HTTP) one `mcp.Client` (declaring the Tasks
extension) calls, in shuffled order each round: the no-op plain tool, `work_start` (a 0 s job),
`work_progress` (no wait) of a running job, `work_fetch` of a completed job, `tasks/get` of
the same completed job, the plain tool `work` declaring Tasks (a 0 s job: the call answers with
`CreateTaskResult`), and, on the SDK's own server, `progress_shaped`: an ordinary tool that runs no
`handles` code and returns a prebuilt result of `work_progress`'s size and output schema (what the SDK
and the transport alone spend on such a result). Each is reported as a ratio to the no-op call
measured in the same rounds. After each call the job that `work_start` or the task creation
started is awaited (untimed), so that its execution, which may go on after the reply, overlaps no
other timed call.
"""

from __future__ import annotations

import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.common import (
    SIGNING_KEY,
    Options,
    Stats,
    Table,
    client,
    log,
    quiet_gc,
    ratio,
    served,
    shuffled_rounds,
    structured,
    verdict,
)

SECTION = "overhead"
TARGETS = {"work_progress": 1.3, "work_start": 2.0}
TASKS_CREATE = "Tasks create (work, CreateTaskResult)"
SHAPED = "SDK alone, work_progress's result (progress_shaped)"
TRANSPORTS = ("inprocess", "stdio", "http", "fastmcp-stdio", "fastmcp-http")
"""The last two: the same server on FastMCP 4 (`python -m bench.app --fastmcp`), its no-op a FastMCP tool."""


async def measure_client(c: Any, rounds: int, warmup: int) -> dict[str, list[float]]:
    """Interleaved rounds of every call on one connected client; samples in seconds."""
    from handles.client import get_task

    running = (await structured(c, "work_start", {"seconds": 3600}))["handle"]
    done = (await structured(c, "work_start", {"seconds": 0}))["handle"]
    finished = await structured(c, "work_fetch", {"handle": done, "wait_seconds": 10})
    assert finished["status"] == "completed", finished
    started: list[str] = []

    async def noop() -> None:
        result = await c.call_tool("noop", {})
        assert not result.is_error

    async def start() -> None:
        started.append((await structured(c, "work_start", {"seconds": 0}))["handle"])

    async def progress() -> None:
        data = await structured(c, "work_progress", {"handle": running})
        assert data["status"] == "working"

    async def fetch() -> None:
        data = await structured(c, "work_fetch", {"handle": done})
        assert data["status"] == "completed"

    async def tasks_get() -> None:
        task = await get_task(c.session, done)
        assert task.status == "completed"

    async def tasks_create() -> None:
        created = await c.session.call_tool("work", {"seconds": 0}, allow_claimed=True)
        assert getattr(created, "result_type", None) == "task", created
        started.append(created.task_id)  # the task id is the job's handle

    async def shaped() -> None:
        result = await c.call_tool("progress_shaped", {})
        assert not result.is_error and result.structured_content is not None

    calls: dict[str, Callable[[], Awaitable[None]]] = {
        "noop": noop,
        "work_start": start,
        "work_progress": progress,
        "work_fetch": fetch,
        "tasks/get": tasks_get,
        TASKS_CREATE: tasks_create,
    }
    if "progress_shaped" in {tool.name for tool in (await c.list_tools()).tools}:
        calls[SHAPED] = shaped

    async def finish_started() -> None:  # untimed: let the started job finish before the next call
        while started:
            await structured(c, "work_fetch", {"handle": started.pop(), "wait_seconds": 10})

    samples = await shuffled_rounds(calls, rounds, warmup, finish_started)
    await structured(c, "work_cancel", {"handle": running})
    return samples


async def run_transport(transport: str, rounds: int, warmup: int, work: Path) -> dict[str, list[float]]:
    from bench.app import build_server, create_jobs
    from handles import HandlesConfig

    data_dir = Path(tempfile.mkdtemp(prefix=f"overhead-{transport}-", dir=work))
    if transport == "inprocess":
        jobs = create_jobs(HandlesConfig(data_dir=data_dir, secret_keys=(SIGNING_KEY,)))
        server = build_server(jobs)
        async with jobs.running(), client(server) as c:
            return await measure_client(c, rounds, warmup)
    across = transport.removeprefix("fastmcp-")
    async with served(across, data_dir, fastmcp=across != transport) as c:
        return await measure_client(c, rounds, warmup)


async def run(options: Options) -> list[Table]:
    rounds = options.n(1000, 60)
    warmup = options.n(50, 10)
    table = options.table(
        SECTION,
        "1. Overhead against the bare call (SQLite file store)",
        ["transport", "call", "p50 ms", "p99 ms", "p50 / no-op", "p99 / no-op", "target", "holds"],
    )
    for transport in TRANSPORTS:
        log(f"overhead: {transport}, {rounds} rounds")
        quiet_gc()
        samples = await run_transport(transport, rounds, warmup, options.work_dir)
        stats = {name: Stats.of(values) for name, values in samples.items()}
        base = stats["noop"]
        table.data[transport] = {name: s.as_dict() for name, s in stats.items()}
        for name, s in stats.items():
            limit = TARGETS.get(name)
            holds = None if limit is None else s.p50 / base.p50 <= limit
            table.rows.append(
                [
                    transport,
                    "no-op plain tool" if name == "noop" else name,
                    *s.cells("p50", "p99"),
                    ratio(s.p50, base.p50),
                    ratio(s.p99, base.p99),
                    f"<= {limit}x" if limit else "",
                    verdict(holds),
                ]
            )
    table.notes += [
        f"{rounds} rounds per transport after {warmup} warm-up rounds; each round calls every row once, in a "
        "freshly shuffled order, so the ratios compare calls measured side by side.",
        "Client: the official `mcp` 2.3 `Client` (protocol 2026-07-28, Tasks extension declared), which also "
        "checks every structured result against the tool's output schema; the no-op tool returns a structured "
        "result too, so both sides pay that check.",
        "`work_progress` reads a running job; `work_fetch` and `tasks/get` read a completed job (with its result); "
        "`work_start` stores a 0 s job (its execution is awaited, untimed, before the next call: a job may run on "
        "after its start's reply, and its work must not land in another call's time).",
        f"{TASKS_CREATE}: `tools/call` of the plain tool `work` (a 0 s job) with the Tasks extension declared, "
        "answered with `CreateTaskResult`; the task is awaited, untimed, before the next call.",
        f"{SHAPED}: an ordinary tool on the SDK's own server (not on FastMCP) that runs no `handles` code and "
        "returns a prebuilt result with `work_progress`'s output schema, fields and text lengths: the share of "
        "`work_progress` that the SDK and the transport spend on such a result (the server's check against the "
        "output model, serialising it twice, as structured content and as text, the client's parsing and its "
        "`jsonschema` check). `work_progress` minus this row is the package's own share.",
        "in-process: `Client(server)` (no transport, no JSON-RPC framing); stdio and http: the server is a "
        "separate process (`python -m bench.app`), http is stateless Streamable HTTP (uvicorn, SSE replies).",
        "fastmcp-stdio and fastmcp-http: the same jobs bound to a FastMCP 4 server (`python -m bench.app "
        "--fastmcp`), the no-op a FastMCP tool on the same server, so each ratio compares calls on FastMCP.",
        "Targets (issue 7) are judged on the p50 ratio.",
    ]
    return [table]
