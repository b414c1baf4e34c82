"""Section 7: several server nodes on one PostgreSQL: starts/s, polls/s and cross-node wake latency.

For 1, 2 and 3 nodes (`python -m bench.app --http` processes on 127.0.0.1, one fresh
schema per node count), the measuring client spreads its calls round robin over the
nodes:

- starts/s: `CONCURRENCY` loops calling `work_start` (a 0 s job) for a fixed time;
- polls/s: `CONCURRENCY` loops calling `work_progress` on a set of finished jobs;
- wake: a job of 0.2 s is started on one node and awaited with a long-polling
  `work_fetch` on another; the latency is from the job's `finished_at` (stored by the
  node that ran it) to the moment the waiting call returned. With one node it is
  the local wake; with more, the cross-node wake through LISTEN/NOTIFY.

All processes share the machine's two cores, so more nodes add no CPU: the figures show
what the shared store costs and what crossing nodes costs, not horizontal scaling.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from typing import Any

from bench.common import Options, Stats, Table, client, handles_http_server, log, postgres_schema

CONCURRENCY = 12
NODE_COUNTS = (1, 2, 3)


async def _throughput(clients: list[Any], call: Any, seconds: float) -> tuple[float, int, Stats]:
    """Run `call(client)` in `CONCURRENCY` loops over the clients for `seconds`: (calls/s, errors, latency)."""
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds
    turn = itertools.count()

    async def loop() -> None:
        nonlocal errors
        while time.perf_counter() < deadline:
            target = clients[next(turn) % len(clients)]
            began = time.perf_counter()
            try:
                result = await call(target)
                if result.is_error:
                    errors += 1
            except Exception:
                errors += 1
            latencies.append(time.perf_counter() - began)

    began = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(CONCURRENCY)))
    elapsed = time.perf_counter() - began
    return len(latencies) / elapsed, errors, Stats.of(latencies)


def _poller(ring: Any) -> Any:
    """`work_progress` on the next handle of `ring` (a cycle over finished jobs)."""
    return lambda target: target.call_tool("work_progress", {"handle": next(ring)})


def _finished_at(database_url: str, job_id: str) -> datetime | None:
    from handles.store import JobRepository

    repository = JobRepository(database_url)
    try:
        job = repository.get(job_id)
        return None if job is None else job.finished_at
    finally:
        repository.dispose()


async def _wake(clients: list[Any], database_url: str, samples: int) -> Stats:
    """Start on node i, wait on node i+1; latency from the stored finished_at to the waiter's return."""
    from bench.common import SIGNING_KEY
    from handles.handle import HandleCodec

    codec = HandleCodec((SIGNING_KEY,))
    latencies: list[float] = []
    for i in range(samples):
        starter, waiter = clients[i % len(clients)], clients[(i + 1) % len(clients)]
        started = await starter.call_tool("work_start", {"seconds": 0.2})
        handle = started.structured_content["handle"]
        done = await waiter.call_tool("work_fetch", {"handle": handle, "wait_seconds": 10})
        returned = datetime.now(UTC)
        assert done.structured_content["status"] == "completed", done
        claims = codec.inspect(handle)
        assert claims is not None
        finished = await asyncio.to_thread(_finished_at, database_url, claims.job_id)
        if finished is not None:
            latencies.append((returned - finished).total_seconds())
    return Stats.of(latencies)


async def run(options: Options) -> list[Table]:
    from handles.store import JobRepository

    seconds = 2.0 if options.quick else 6.0
    samples = options.n(40, 8)
    counts = NODE_COUNTS if not options.quick else (1, 2)
    table = options.table(
        "multinode",
        "7. Multi-node: N server nodes on one PostgreSQL (round robin over the nodes)",
        [
            "nodes",
            "starts/s",
            "start p50 / p99 (ms)",
            "polls/s",
            "poll p50 / p99 (ms)",
            "wake p50 / p99 (ms)",
            "errors",
        ],
    )
    for count in counts:
        with postgres_schema(options.postgres_url, f"nodes{count}") as url:
            if url is None:
                table.rows.append([count, "unreachable", "", "", "", "", ""])
                continue
            repository = JobRepository(url)
            repository.prepare(auto_migrate=True)
            repository.dispose()
            servers = [
                handles_http_server(
                    options.work_dir / f"nodes{count}-{i}",
                    database_url=url,
                    HANDLES_MAX_ACTIVE_PER_PRINCIPAL="1000000",
                    HANDLES_MAX_RUNNING="64",
                ).start()
                for i in range(count)
            ]
            try:
                async with AsyncExitStack() as stack:
                    clients = [await stack.enter_async_context(client(s.url, tasks=False)) for s in servers]
                    log(f"multinode: {count} node(s): starts")
                    starts, start_errors, start_stats = await _throughput(
                        clients, lambda c: c.call_tool("work_start", {"seconds": 0}), seconds
                    )
                    handles = []
                    for i in range(50):
                        result = await clients[i % count].call_tool("work_start", {"seconds": 0})
                        handles.append(result.structured_content["handle"])
                    await clients[0].call_tool("work_fetch", {"handle": handles[-1], "wait_seconds": 10})
                    log(f"multinode: {count} node(s): polls")
                    polls, poll_errors, poll_stats = await _throughput(
                        clients, _poller(itertools.cycle(handles)), seconds
                    )
                    log(f"multinode: {count} node(s): wake")
                    wake = await _wake(clients, url, samples)
            finally:
                for server in servers:
                    server.stop()
            table.rows.append(
                [
                    count,
                    f"{starts:.0f}",
                    start_stats.p50_p99,
                    f"{polls:.0f}",
                    poll_stats.p50_p99,
                    wake.p50_p99,
                    start_errors + poll_errors,
                ]
            )
            table.data[str(count)] = {
                "starts_per_s": starts,
                "polls_per_s": polls,
                "start": start_stats.as_dict(),
                "poll": poll_stats.as_dict(),
                "wake": wake.as_dict(),
                "errors": start_errors + poll_errors,
            }
    table.notes += [
        f"{CONCURRENCY} concurrent call loops, {seconds:g} s per measurement; each node runs its own workers "
        "(in-process) and claims jobs with FOR UPDATE SKIP LOCKED.",
        "Wake: a 0.2 s job started on node i, awaited by a long-polling work_fetch on node i+1; from the "
        "job's stored finished_at to the waiter's return (with 1 node, the local wake).",
        "Every process shares the same 2 cores: more nodes add no CPU here, so the figures show the cost "
        "of the shared store and of crossing nodes, not horizontal scaling.",
    ]
    return [table]
