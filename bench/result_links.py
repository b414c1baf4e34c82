"""Section result_links: a large result as a link, stored in parts and read back over Streamable HTTP.

The example server (`python -m example_server --http`, `EXAMPLE_JOB_SECONDS=0`) exports CSV rows
with `export_dataset`, which returns a `ResultFile`; the official client follows it with
`export_dataset_fetch` and reads the link with `handles.client.read_link` (one `resources/read` per
1 MiB part). Per database (an SQLite file; PostgreSQL when reachable): the size of the fetch reply
against the file, the time from start to completed (generating and storing the file), the read
throughput, and how much the server's peak resident memory (`VmHWM`) grew while it stored the file
and while it served it.

    python bench/result_links.py            # this section alone (50 MB)
    python bench/run.py --only result_links [--quick]   # --quick: 5 MB
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Options, Table, client, handles_env, postgres_schema, run_alone
from tests.harness.process import ServerProcess, free_port, status_kib

SECTION = "result_links"


def example_server(data_dir: Path, database_url: str) -> ServerProcess:
    port = free_port()
    return ServerProcess(
        [sys.executable, "-m", "example_server", "--http", "--port", str(port)],
        handles_env(data_dir, database_url, EXAMPLE_JOB_SECONDS="0", HANDLES_AUTO_MIGRATE="1"),
        data_dir / f"server-{port}.log",
        port,
        start_timeout=60,
    )


async def measure(server: ServerProcess, rows: int) -> dict[str, Any]:
    from handles.client import read_link

    async with client(server.url, tasks=False) as c:
        await c.call_tool("lookup_account", {"account": "warm"})
        at_start = status_kib(server.pid, "VmHWM") or 0
        began = time.perf_counter()
        started = (await c.call_tool("export_dataset_start", {"rows": rows})).structured_content or {}
        fetched = await c.call_tool("export_dataset_fetch", {"handle": started["handle"], "wait_seconds": 50})
        stored_seconds = time.perf_counter() - began
        reply = fetched.model_dump_json(by_alias=True, exclude_none=True)
        data = fetched.structured_content or {}
        if data.get("status") != "completed":
            raise RuntimeError(f"the export did not complete: {reply[:500]}")
        link = data["result_link"]
        after_store = status_kib(server.pid, "VmHWM") or 0
        began = time.perf_counter()
        size = 0
        async for chunk in read_link(c, link):
            size += len(chunk)
        read_seconds = time.perf_counter() - began
        after_read = status_kib(server.pid, "VmHWM") or 0
    return {
        "file_bytes": size,
        "parts": link["parts"],
        "reply_bytes": len(reply.encode()),
        "stored_seconds": stored_seconds,
        "read_seconds": read_seconds,
        "read_mb_per_s": size / 1e6 / read_seconds,
        "peak_growth_store_mib": (after_store - at_start) / 1024,
        "peak_growth_read_mib": (after_read - after_store) / 1024,
    }


async def run(options: Options) -> list[Table]:
    rows = options.n(1_500_000, 150_000)
    table = options.table(
        SECTION,
        f"Large results: a CSV export of {rows:,} rows as a link, over Streamable HTTP",
        [
            "database",
            "file",
            "parts",
            "fetch reply",
            "start -> completed",
            "read (all parts)",
            "read rate",
            "server peak memory growth: store / read",
        ],
    )
    with tempfile.TemporaryDirectory(prefix="links-", dir=options.work_dir) as scratch:
        for label in ("SQLite file", "PostgreSQL"):
            with contextlib.ExitStack() as stack:
                url = (
                    ""
                    if label == "SQLite file"
                    else stack.enter_context(postgres_schema(options.postgres_url, "links"))
                )
                if url is None:
                    table.notes.append(f"{label} was unreachable: not measured.")
                    continue
                server = example_server(Path(scratch) / label.split()[0].lower(), url).start()
                stack.callback(server.stop)
                figures = await measure(server, rows)
            table.rows.append(
                [
                    label,
                    f"{figures['file_bytes'] / 1e6:.1f} MB",
                    figures["parts"],
                    f"{figures['reply_bytes']:,} B",
                    f"{figures['stored_seconds']:.2f} s",
                    f"{figures['read_seconds']:.2f} s",
                    f"{figures['read_mb_per_s']:.0f} MB/s",
                    f"{figures['peak_growth_store_mib']:.1f} / {figures['peak_growth_read_mib']:.1f} MiB",
                ]
            )
            table.data[label] = figures
    table.notes.append(
        "The fetch reply is the whole `tools/call` result (metadata, `next`, the `resource_link` item). "
        "Start -> completed includes generating the CSV (the job's own work) and storing it in 1 MiB "
        "parts, each its own write. Memory: growth of the server process's VmHWM while the job "
        "stored the file, then while the client read every part; the file never sits in memory whole."
    )
    return [table]


def main() -> None:
    run_alone(run, "python bench/result_links.py", with_data=True)


if __name__ == "__main__":
    main()
