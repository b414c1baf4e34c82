"""Section tool_list_size: what the tool list costs a model's context, per layout and number of jobs.

For 2 and 10 jobs (the example server's jobs, declared again under other names: generate_report,
deploy_release, export_dataset, generate_report_2, ...; one in three asks questions), each in the
per-job and the compact layout, a server is built in this process and the official `mcp.Client`
lists its tools. The size is that of the `tools/list` result the client received, serialised as
the JSON a transport carries (`model_dump_json(by_alias=True, exclude_none=True)`: names, titles,
descriptions, input and output schemas, annotations). Nothing is timed, so the figures are exact
and the same on every machine.

    python bench/tool_list_size.py            # this section alone
    python bench/run.py --only tool_list_size
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Options, Table, handles_config, run_alone

SECTION = "tool_list_size"
JOB_COUNTS = (2, 10)
LAYOUTS = ("per_job", "compact")


def declare(jobs: Any, count: int) -> None:
    """`count` jobs: the example jobs in turn, the n-th round named `<job>_n` (n >= 2)."""
    from example_server.server import EXAMPLE_JOBS

    for index in range(count):
        function, options = EXAMPLE_JOBS[index % len(EXAMPLE_JOBS)]
        rounds = index // len(EXAMPLE_JOBS)
        name = function.__name__ if rounds == 0 else f"{function.__name__}_{rounds + 1}"
        jobs.job(name=name, **options)(function)


async def listing(data_dir: Path, count: int, layout: str) -> tuple[int, int, int]:
    """(tool count, bytes, bytes of the output schemas) of the `tools/list` result a client gets from
    `count` jobs in `layout`."""
    from mcp import Client
    from mcp.server.mcpserver import MCPServer

    from handles import Handles

    jobs = Handles(handles_config(data_dir))
    declare(jobs, count)
    server: MCPServer[Any] = MCPServer("tool-list-size", extensions=[jobs.tasks_extension()])
    jobs.bind(server, layout=layout)  # type: ignore[arg-type]
    try:
        async with Client(server) as client:
            result = await client.list_tools()
    finally:
        await jobs.aclose()
    body = result.model_dump_json(by_alias=True, exclude_none=True)
    outputs = sum(len(json.dumps(tool.output_schema, separators=(",", ":"))) for tool in result.tools)
    return len(result.tools), len(body.encode()), outputs


async def run(options: Options) -> list[Table]:
    table = options.table(
        SECTION,
        "Tool-list weight: tools/list size by layout and number of jobs",
        [
            "jobs",
            "layout",
            "tools",
            "tools/list bytes",
            "bytes per job",
            "vs per_job",
            "output schemas",
        ],
    )
    with tempfile.TemporaryDirectory(prefix="tool-list-", dir=options.work_dir) as scratch:
        for count in JOB_COUNTS:
            per_job_bytes = 0
            for layout in LAYOUTS:
                tools, size, outputs = await listing(Path(scratch) / f"{count}-{layout}", count, layout)
                per_job_bytes = per_job_bytes or size
                table.rows.append(
                    [
                        count,
                        layout,
                        tools,
                        f"{size:,}",
                        f"{size / count:,.0f}",
                        f"{size / per_job_bytes:.2f}x",
                        f"{outputs / size:.0%}",
                    ]
                )
                table.data[f"{count}_{layout}"] = {
                    "tools": tools,
                    "bytes": size,
                    "output_schema_bytes": outputs,
                }
    table.notes.append(
        "Bytes of the `tools/list` result as the client received it, as compact JSON; one job in three "
        "asks questions (its respond tool). Output schemas: the share of those bytes in the tools' "
        "outputSchema. Exact: nothing here is timed."
    )
    return [table]


def main() -> None:
    run_alone(run, "python bench/tool_list_size.py")


if __name__ == "__main__":
    main()
