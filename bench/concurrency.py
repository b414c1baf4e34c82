"""Section 5: concurrency. 1,000 concurrent jobs followed by 50 polling clients.

The `handles` bench server runs as its own process over Streamable HTTP (SQLite file store), with
bearer tokens so that each of the 50 clients is its own principal (20 jobs each stays under the
per-principal cap of 50 active jobs). Each client starts its 20 jobs (1 s each), then polls them with
`work_progress` (no wait) back to back, and fetches each one once it is completed. Reported: the time
until every job was seen completed, polls per second, latencies, errors, and the server's memory
(`VmHWM`, the peak resident set, from /proc) and CPU time.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Options, Stats, Table, client, handles_http_server, log, verdict
from tests.harness.process import cpu_seconds, status_kib

SECTION = "concurrency"
JOB_SECONDS = 1.0


async def _timed_call(c: Any, record: dict[str, Any], kind: str, tool: str, arguments: dict[str, Any]) -> Any:
    """The result of calling `tool` once, its time added to `record[kind]`; None, with the error recorded
    under `kind`, when the call raised."""
    started = time.perf_counter()
    try:
        result = await c.call_tool(tool, arguments)
    except Exception as exc:
        record["errors"].append(f"{kind}: {exc!r}")
        return None
    record[kind].append(time.perf_counter() - started)
    return result


async def _client_run(url: str, token: str, jobs: int, record: dict[str, Any], ready: asyncio.Event) -> None:
    async with client(url, token=token, tasks=False) as c:
        await c.call_tool("noop", {})  # connect and list tools before the clock starts
        record["connected"] += 1
        await ready.wait()
        handles: list[str] = []
        for _ in range(jobs):
            result = await _timed_call(c, record, "start", "work_start", {"seconds": JOB_SECONDS})
            if result is None:
                continue
            if result.is_error or result.structured_content is None:
                record["errors"].append(f"start: {result.content}")
                continue
            handles.append(result.structured_content["handle"])
        record["all_started"] = time.perf_counter()
        pending = list(handles)
        while pending:
            for handle in list(pending):
                result = await _timed_call(c, record, "progress", "work_progress", {"handle": handle})
                if result is None:
                    continue
                data = result.structured_content or {}
                if result.is_error or "status" not in data:
                    record["errors"].append(f"progress: {result.content}")
                    pending.remove(handle)
                    continue
                if data["status"] == "working":
                    continue
                pending.remove(handle)
                record["ended"] = time.perf_counter()
                started = time.perf_counter()
                fetched = await c.call_tool("work_fetch", {"handle": handle})
                record["fetch"].append(time.perf_counter() - started)
                status = (fetched.structured_content or {}).get("status")
                if status == "completed":
                    record["completed"] += 1
                else:
                    record["errors"].append(f"fetch: status {status}: {fetched.content}")


async def scenario(options: Options, jobs_total: int, clients: int, max_running: int) -> dict[str, Any]:
    data_dir = Path(tempfile.mkdtemp(prefix="concurrency-", dir=options.work_dir))
    tokens = {f"bench-token-{i:03d}-{'x' * 16}": f"client-{i:03d}" for i in range(clients)}
    tokens_file = data_dir / "tokens.json"
    data_dir.mkdir(parents=True, exist_ok=True)
    tokens_file.write_text(json.dumps(tokens))
    server = handles_http_server(
        data_dir,
        tokens=tokens_file,
        HANDLES_MAX_RUNNING=str(max_running),
        HANDLES_MAX_ACTIVE_PER_PRINCIPAL="50",
        **{k: v for k, v in os.environ.items() if k.startswith("BENCH_")},
    ).start()
    per_client = jobs_total // clients
    record: dict[str, Any] = {
        "start": [],
        "progress": [],
        "fetch": [],
        "errors": [],
        "completed": 0,
        "connected": 0,
        "ended": 0.0,
        "all_started": 0.0,
    }
    ready = asyncio.Event()
    try:
        tasks = [
            asyncio.create_task(_client_run(server.url, token, per_client, record, ready)) for token in tokens
        ]
        while record["connected"] < clients:
            if any(t.done() for t in tasks):
                break
            await asyncio.sleep(0.05)
        rss_before = status_kib(server.pid, "VmRSS")
        cpu_before = cpu_seconds(server.pid)
        began = time.perf_counter()
        ready.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                record["errors"].append(f"client: {result!r}")
        finished = time.perf_counter()
        record.update(
            began=began,
            finished=finished,
            rss_before_kb=rss_before,
            rss_after_kb=status_kib(server.pid, "VmRSS"),
            hwm_kb=status_kib(server.pid, "VmHWM"),
            server_cpu_s=(cpu_seconds(server.pid) or 0) - (cpu_before or 0),
        )
    finally:
        server.stop()
    return record


async def run(options: Options) -> list[Table]:
    jobs_total, clients = (100, 10) if options.quick else (1000, 50)
    configs = (
        [("max_running=1000", 1000)]
        if options.quick
        else [("max_running=1000", 1000), ("default max_running=32", 32)]
    )
    table = options.table(
        SECTION,
        f"5. Concurrency: {jobs_total} concurrent jobs ({JOB_SECONDS:g} s each), {clients} polling clients, "
        "Streamable HTTP, SQLite file",
        [
            "server",
            "jobs completed",
            "errors",
            "all completed after s",
            "work_start p50 / p99 ms",
            "polls",
            "polls/s",
            "work_progress p50 / p99 ms",
            "work_fetch p50 / p99 ms",
            "server RSS before -> peak (VmHWM) MiB",
            "server CPU s",
        ],
    )
    for label, max_running in configs:
        log(f"concurrency: {jobs_total} jobs, {clients} clients, {label}")
        record = await scenario(options, jobs_total, clients, max_running)
        duration = record["finished"] - record["began"]
        poll_phase = max(record["finished"] - record["all_started"], 1e-9)
        start, progress, fetch = (Stats.of(record[k]) for k in ("start", "progress", "fetch"))
        ok = record["completed"] == jobs_total and not record["errors"]
        table.data[label] = {
            "completed": record["completed"],
            "errors": record["errors"][:20],
            "duration_s": duration,
            "polls": len(record["progress"]),
            "polls_per_s": len(record["progress"]) / poll_phase,
            "start": start.as_dict(),
            "progress": progress.as_dict(),
            "fetch": fetch.as_dict(),
            "rss_before_kb": record["rss_before_kb"],
            "rss_after_kb": record["rss_after_kb"],
            "hwm_kb": record["hwm_kb"],
            "server_cpu_s": record["server_cpu_s"],
        }
        table.rows.append(
            [
                label,
                f"{record['completed']} / {jobs_total}",
                f"{len(record['errors'])}"
                + ("" if ok else " **(not all completed)**" if record["completed"] != jobs_total else ""),
                f"{duration:.1f}",
                start.p50_p99,
                len(record["progress"]),
                f"{len(record['progress']) / poll_phase:.0f}",
                progress.p50_p99,
                fetch.p50_p99,
                f"{(record['rss_before_kb'] or 0) / 1024:.0f} -> {(record['hwm_kb'] or 0) / 1024:.0f}",
                f"{record['server_cpu_s']:.1f}",
            ]
        )
        if record["errors"]:
            table.notes.append(f"{label}: first errors: {record['errors'][:3]}")
    table.notes += [
        f"All {clients} clients run in the measuring process (one `mcp.Client` each, with its own bearer token, "
        "so its own principal); the server is a separate process. On 2 shared cores the clients and the server "
        "compete for CPU: polls/s is the throughput of the pair, not of the server alone.",
        "Clients poll back to back (no pause): a closed-loop load of at most one request in flight per client.",
        "`all completed after` runs from the first start to the moment the last job was seen completed; with "
        "max_running=32 (the default) jobs queue and run 32 at a time.",
        "Memory is the server process's resident set before the load and its peak (VmHWM) over the run.",
        f"Target: every job completes with no error, memory bounded: {verdict(all(d['completed'] == jobs_total and not d['errors'] for d in table.data.values()))}.",
    ]
    return [table]
