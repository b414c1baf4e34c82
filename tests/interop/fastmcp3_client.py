"""FastMCP 3 (`fastmcp[tasks]==3.4.11`, on `mcp` 1.x) against the example server: the 2025-11-25 experimental Tasks design.

Runs in tests/interop/.venv-fastmcp3, never in the project's environment:

    tests/interop/.venv-fastmcp3/bin/python tests/interop/fastmcp3_client.py URL TOKEN OTHER_TOKEN

`call_tool(..., task=True)` as TOKEN's principal: a report followed to its result, an export cancelled,
a deployment's question answered by the elicitation handler while `tasks/result` waits, the tasks listed; then OTHER_TOKEN's principal tries the report's task. Prints one JSON object.
With `--nodes TOKEN URL FROM [--hold]` it reads a deployment's question through `tasks/result` on URL and answers
it through its elicitation handler (`--hold`: prints what it saw once asked and leaves the question open while it
lives); FROM is another node's URL to create the deployment on first, or the taskId of one created before.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from mcp.shared.exceptions import McpError

seen: dict[str, Any] = {"asked": []}
HOLD = "--hold" in sys.argv


async def approve(message: str, response_type: Any, params: Any, context: Any) -> dict[str, Any]:
    seen["asked"].append(params.model_dump(mode="json", by_alias=True, exclude_none=True))
    if HOLD:  # the question stays open while this process lives
        print(json.dumps(seen), flush=True)
        await asyncio.Event().wait()
    return {"approve": True, "environment": "production"}


def connect(url: str, token: str) -> Client:
    transport = StreamableHttpTransport(url, headers={"Authorization": f"Bearer {token}"})
    return Client(transport, timeout=60, elicitation_handler=approve)


async def main(url: str, token: str, other_token: str) -> None:
    async with connect(url, token) as client:
        report = await client.call_tool("generate_report", {"account": "acme", "months": 2}, task=True)
        seen["report_id"] = report.task_id
        seen["immediate"] = report.returned_immediately
        seen["report"] = (await report.result()).structured_content
        seen["ended"] = (await report.status()).status
        export = await client.call_tool("export_dataset", {"rows": 1000}, task=True)
        seen["export_id"] = export.task_id
        await export.cancel()
        seen["cancelled"] = (await client.get_task_status(export.task_id)).status
        deploy = await client.call_tool("deploy_release", {"version": "6.0.0"}, task=True)
        seen["deploy_id"] = deploy.task_id
        await deploy.wait(state="input_required", timeout=30)
        # tasks/result: the question comes on its stream, the handler's answer resumes the job.
        seen["deployed"] = (await client.get_task_result(deploy.task_id))["structuredContent"]
        seen["listed"] = [task["taskId"] for task in (await client.list_tasks())["tasks"]]
    async with connect(url, other_token) as other:
        try:
            await other.get_task_status(seen["report_id"])
        except McpError as error:
            seen["foreign"] = {"code": error.error.code, "message": error.error.message}
        seen["other_listed"] = (await other.list_tasks())["tasks"]
    print(json.dumps(seen))


async def across_nodes(token: str, url: str, origin: str) -> None:
    """A deployment created on the node at `origin` (or `origin`, a taskId), its question read and answered
    through `tasks/result` on a new session with the node at `url`."""
    seen["taskId"] = origin
    if origin.startswith("http"):
        async with connect(origin, token) as creator:
            created = await creator.call_tool("deploy_release", {"version": "8.0.0"}, task=True)
            seen["taskId"] = created.task_id
    async with connect(url, token) as client:
        seen["result"] = await client.get_task_result(seen["taskId"])
    print(json.dumps(seen))


if __name__ == "__main__":
    if sys.argv[1] == "--nodes":  # --nodes TOKEN URL FROM [--hold]
        asyncio.run(across_nodes(*sys.argv[2:5]))
    else:
        asyncio.run(main(*sys.argv[1:4]))
