"""The FastMCP binding under another FastMCP 4 release: the example's jobs on a FastMCP server, driven
in-process by FastMCP's own `Client`.

Runs in a virtual environment of its own (created by tests/interop/test_fastmcp_versions.py) that
holds that FastMCP and this project, never in the project's environment:

    VENV/bin/python tests/interop/fastmcp_server_check.py

With `fastmcp-tasks` installed it also checks how the two share one server: binding with the Tasks
face on a server that already serves fastmcp-tasks' extension is refused, and with `tasks=False`
fastmcp-tasks' own `task=True` tool and the jobs' plain and handle tools all work side by side.
Prints what it observed as one JSON object on stdout; the pytest side asserts on it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from importlib.metadata import version
from typing import Any

from fastmcp import Client, FastMCP

from example_server.server import build_fastmcp_server, create_jobs
from handles.errors import ConfigurationError


async def drive_jobs(client: Client[Any], seen: dict[str, Any], prefix: str) -> None:
    """A job through its handle tools, its plain tool, a mistaken argument and a made-up handle."""
    started = await client.call_tool("generate_report_start", {"account": "acme", "months": 2})
    handle = started.structured_content["handle"]
    fetched = await client.call_tool("generate_report_fetch", {"handle": handle, "wait_seconds": 30})
    seen[f"{prefix}fetched"] = fetched.structured_content
    plain = await client.call_tool("generate_report", {"account": "globex", "months": 1})
    seen[f"{prefix}plain"] = plain.structured_content
    mistake = await client.call_tool(
        "generate_report_start", {"account": "acme", "monthz": 1}, raise_on_error=False
    )
    seen[f"{prefix}mistake"] = json.loads(mistake.content[0].text)
    made_up = await client.call_tool("generate_report_progress", {"handle": "made-up"}, raise_on_error=False)
    seen[f"{prefix}made_up"] = json.loads(made_up.content[0].text)


async def main() -> dict[str, Any]:
    seen: dict[str, Any] = {"fastmcp": version("fastmcp-slim")}  # FastMCP itself; `fastmcp` is its bundle
    jobs = create_jobs()
    server = build_fastmcp_server(jobs)
    async with jobs.running(), Client(server) as client:
        seen["tools"] = sorted(tool.name for tool in await client.list_tools())
        await drive_jobs(client, seen, "")

    if importlib.util.find_spec("fastmcp_tasks") is None:
        return seen
    from fastmcp_tasks import TasksExtension as FastMCPTasksExtension
    from fastmcp_tasks import call_tool_task

    seen["fastmcp_tasks"] = version("fastmcp-tasks")
    both = FastMCP("both")
    both.add_extension(FastMCPTasksExtension(url="memory://"))
    try:
        create_jobs().bind(both)
        seen["refused"] = None
    except ConfigurationError as error:
        seen["refused"] = str(error)

    side = FastMCP("side by side")
    side.add_extension(FastMCPTasksExtension(url="memory://"))

    @side.tool(task=True)
    async def slow_sum(a: int, b: int) -> int:
        """A fastmcp-tasks tool: a call that declares the extension becomes one of its tasks."""
        await asyncio.sleep(0.2)
        return a + b

    coexisting = create_jobs()
    coexisting.bind(side, tasks=False)
    async with coexisting.running(), Client(side) as client:
        task = await call_tool_task(client, "slow_sum", {"a": 2, "b": 3})
        seen["side_task_id"] = task.task_id
        seen["side_task"] = (await task.result()).structured_content
        await drive_jobs(client, seen, "side_")
    return seen


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main()), default=str))
    sys.stdout.flush()
