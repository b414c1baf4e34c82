"""Section 13: the poll traffic that pushed task status saves (issue 18).

N followers at once, each the official client with `TasksClientExtension`, each calls a job of S
seconds as a task and waits for its result; once with push (the client opens a
`subscriptions/listen` stream naming its task and takes the `notifications/tasks` the server pushes),
once without (`TasksClientExtension(push=False)`: it polls `tasks/get` at the server's
`pollIntervalMs`). Every HTTP request the followers send is counted by its `Mcp-Method` header, on
two servers over Streamable HTTP (SQLite file):

- the bench server's `work` job: sleeps S seconds, writes no progress, `pollIntervalMs` 100;
- the example server's `generate_report` (EXAMPLE_JOB_SECONDS=S, 10 months): one progress write
  per month, `pollIntervalMs` 2000.

Full: 100 followers of 10 s jobs. Quick: 10 followers of 2 s jobs.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import Options, Stats, Table, handles_env, log
from tests.harness.process import ServerProcess, free_port

SECTION = "push"


def _server(kind: str, data_dir: Path, seconds: float) -> ServerProcess:
    port = free_port()
    module = "bench.app" if kind == "bench" else "example_server"
    env = handles_env(
        data_dir,
        HANDLES_MAX_ACTIVE_PER_PRINCIPAL="1000",
        HANDLES_MAX_RUNNING="200",
        EXAMPLE_JOB_SECONDS=str(seconds),
    )
    return ServerProcess(
        [sys.executable, "-m", module, "--http", "--port", str(port)],
        env,
        data_dir / f"{kind}-{port}.log",
        port,
        start_timeout=60,
    )


async def followers(url: str, *, count: int, call: tuple[str, dict[str, Any]], push: bool) -> dict[str, Any]:
    """`count` concurrent followers of one job each; the requests they sent, by method, and their times."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from handles.client import TasksClientExtension

    sent: Counter[str] = Counter()

    async def counted(request: httpx2.Request) -> None:
        sent[request.headers.get("mcp-method", "?")] += 1

    extension = TasksClientExtension(push=push)
    tool, arguments = call
    # Every follower holds a listen stream open: room for all of them and their requests.
    limits = httpx2.Limits(max_connections=count * 3, max_keepalive_connections=count * 3)
    times: list[float] = []
    async with httpx2.AsyncClient(
        timeout=httpx2.Timeout(60, read=300), limits=limits, event_hooks={"request": [counted]}
    ) as http:

        async def one() -> None:
            async with Client(
                streamable_http_client(url, http_client=http), extensions=[extension]
            ) as client:
                began = time.perf_counter()
                result = await client.call_tool(tool, arguments)
                times.append(time.perf_counter() - began)
                assert not result.is_error, result

        await asyncio.gather(*(one() for _ in range(count)))
    pushes = extension.pushes.received if extension.pushes is not None else 0
    return {"sent": dict(sent), "times": times, "pushes": pushes}


async def run(options: Options) -> list[Table]:
    count = options.n(100, 10)
    seconds = float(options.n(10, 2))
    calls = {
        "bench": ("work", {"seconds": seconds}),
        "example": ("generate_report", {"account": "acme", "months": 10}),
    }
    labels = {
        "bench": "`work` (no progress, pollIntervalMs 100)",
        "example": "`generate_report` (10 progress writes, pollIntervalMs 2000)",
    }
    rows: list[list[Any]] = []
    data: dict[str, Any] = {}
    for kind, call in calls.items():
        server = _server(kind, options.work_dir / f"push-{kind}", seconds).start()
        try:
            # One warm-up follower: the schema, the first connection, the imports.
            await followers(server.url, count=1, call=call, push=True)
            for push in (False, True):
                log(f"push: {kind}, {count} followers, push={push}")
                measured = await followers(server.url, count=count, call=call, push=push)
                sent = measured["sent"]
                total = sum(sent.values())
                per_follower = {method: n / count for method, n in sent.items()}
                stats = Stats.of(measured["times"])
                rows.append(
                    [
                        labels[kind],
                        "push" if push else "polling",
                        total,
                        f"{per_follower.get('tasks/get', 0.0):.1f}",
                        f"{per_follower.get('subscriptions/listen', 0.0):.1f}",
                        measured["pushes"],
                        f"{stats.p50 / 1000:.2f} s / {stats.maximum / 1000:.2f} s",
                    ]
                )
                data[f"{kind}-{'push' if push else 'poll'}"] = {"sent": sent, "pushes": measured["pushes"]}
        finally:
            server.stop()
    saved = []
    for kind in calls:
        polled = sum(data[f"{kind}-poll"]["sent"].values())
        pushed = sum(data[f"{kind}-push"]["sent"].values())
        saved.append(
            f"{kind}: {polled} -> {pushed} requests ({polled - pushed} fewer, {polled / max(pushed, 1):.1f}x)"
        )
    return [
        options.table(
            SECTION,
            f"13. Pushed task status: requests of {count} followers of {seconds:g} s jobs, with and without push",
            [
                "job",
                "followers",
                "requests (all)",
                "tasks/get per follower",
                "subscriptions/listen per follower",
                "notifications/tasks received",
                "call time p50 / max",
            ],
            rows=rows,
            notes=[
                "Requests counted at the clients by Mcp-Method (server/discover, tools/list, tools/call, "
                "tasks/get, subscriptions/listen); a listen stream is one request however long it stays open.",
                "With push a follower sends no tasks/get: the server pushes the state at the acknowledgement "
                "and each change (the last one carries the result); it would send one after 30 s without a push.",
                *saved,
            ],
            data=data,
        )
    ]
