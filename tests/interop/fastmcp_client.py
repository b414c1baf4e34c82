"""A third-party client against the example server: FastMCP 4 (with or without `fastmcp-tasks` 4.1.4).

Runs in bench/.peer-venv (created by `bench.peer.ensure_peer_venv`), never in the project's environment:

    bench/.peer-venv/bin/python tests/interop/fastmcp_client.py URL TOKEN tasks|plain|tasks-off|task-after

URL is the server's Streamable HTTP endpoint, or `stdio:FILE` to launch the server over stdio: FILE holds
`{"command", "args", "env", "cwd"}` as JSON (TOKEN is then not sent: stdio has no bearer token).

`tasks`: imports `fastmcp_tasks`, which turns on FastMCP's Tasks client; follows a report to its
result, answers a deployment's question (through `tasks/update`), reads an export's CSV through the
resource_link of its result, and cancels another export (`tasks/cancel`).
`plain`: FastMCP's client without the Tasks extension, on the plain and handle tools.
`tasks-off`: `fastmcp_tasks` imported while the server's Tasks kill switch is on: plain answers.
`task-after`: `fastmcp_tasks` imported, against bench.app's `work_inline` (a job with `task_after`).
Prints what it observed as one JSON object on stdout; the pytest side asserts on it.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from fastmcp import Client
from fastmcp.client.transports import StdioTransport, StreamableHttpTransport

QUESTIONS: list[str] = []


async def approve(message: str, response_type: Any, params: Any, context: Any) -> dict[str, Any]:
    QUESTIONS.append(message)
    return {"approve": True, "environment": "staging"}


def connect(url: str, token: str) -> Client:
    transport: StdioTransport | StreamableHttpTransport
    if url.startswith("stdio:"):
        server = json.loads(Path(url.removeprefix("stdio:")).read_text())
        transport = StdioTransport(
            server["command"], server["args"], env=server["env"], cwd=server["cwd"], keep_alive=False
        )
    else:
        transport = StreamableHttpTransport(url, headers={"Authorization": f"Bearer {token}"})
    return Client(transport, elicitation_handler=approve, timeout=60)


async def with_tasks(url: str, token: str) -> dict[str, Any]:
    import fastmcp_tasks
    from fastmcp_tasks import call_tool_task

    seen: dict[str, Any] = {"fastmcp_tasks": fastmcp_tasks.__version__}
    async with connect(url, token) as client:
        # The plain call a FastMCP user makes: the task is followed transparently.
        report = await client.call_tool("generate_report", {"account": "acme", "months": 2})
        seen["report"] = report.structured_content

        # The same, driven explicitly: a task id, then its result.
        task = await call_tool_task(client, "generate_report", {"account": "globex", "months": 2})
        seen["report_task_id"] = task.task_id
        seen["report_task"] = (await task.result()).structured_content

        # A deployment asks for approval; the answer goes back through tasks/update.
        deploy = await call_tool_task(client, "deploy_release", {"version": "4.1.4"})
        asked = await deploy.wait(state="input_required", timeout=30)
        seen["deploy_asked"] = sorted(asked.input_requests or {})
        seen["deploy"] = (await deploy.result()).structured_content

        # An export run to its end: its CSV comes back as a resource_link, read with resources/read.
        finished = await (await call_tool_task(client, "export_dataset", {"rows": 300})).result()
        seen["export_link"] = await read_linked(client, finished.content)

        # An export cancelled mid-way with tasks/cancel.
        export = await call_tool_task(client, "export_dataset", {"rows": 1000})
        await export.wait(state="working", timeout=30)
        await export.cancel()
        seen["export_final"] = (await export.wait(timeout=30)).status
        # The same job through its handle tool: the taskId is the handle.
        progress = await client.call_tool("export_dataset_progress", {"handle": export.task_id})
        seen["export_progress_status"] = (progress.structured_content or {}).get("status")
    seen["questions"] = QUESTIONS
    return seen


async def without_tasks(url: str, token: str) -> dict[str, Any]:
    seen: dict[str, Any] = {"fastmcp_tasks_imported": "fastmcp_tasks" in sys.modules}
    async with connect(url, token) as client:
        report = await client.call_tool("generate_report", {"account": "acme", "months": 2})
        seen["report"] = report.structured_content
        handed = (await client.call_tool("deploy_release", {"version": "1.0.0"})).structured_content or {}
        seen["deploy_handoff"] = handed.get("status")
        handle = handed["handle"]
        for _ in range(100):
            state = await client.call_tool("deploy_release_progress", {"handle": handle, "wait_seconds": 5})
            if (state.structured_content or {}).get("status") == "input_required":
                break
        answer = {"approve": True, "environment": "production"}
        await client.call_tool("deploy_release_respond", {"handle": handle, "responses": {"q1": answer}})
        fetched = await client.call_tool("deploy_release_fetch", {"handle": handle, "wait_seconds": 20})
        seen["deploy"] = (fetched.structured_content or {}).get("result")
        started = (await client.call_tool("export_dataset_start", {"rows": 1000})).structured_content or {}
        await client.call_tool("export_dataset_cancel", {"handle": started["handle"]})
        final = await client.call_tool(
            "export_dataset_fetch", {"handle": started["handle"], "wait_seconds": 20}
        )
        seen["export_final"] = (final.structured_content or {}).get("status")
        done = (await client.call_tool("export_dataset", {"rows": 300})).content
        seen["export_link"] = await read_linked(client, done)
    return seen


async def read_linked(client: Client, content: list[Any]) -> dict[str, Any]:
    """The resource_link in a tool result, read with FastMCP's resources/read."""
    (link,) = [block for block in content if getattr(block, "type", None) == "resource_link"]
    contents = await client.read_resource(str(link.uri))
    text = "".join(getattr(item, "text", "") for item in contents)
    return {
        "mime_type": link.mimeType,
        "size": link.size,
        "read_bytes": len(text.encode()),
        "rows": text.count("\n") - 1,
    }


async def tasks_switched_off(url: str, token: str) -> dict[str, Any]:
    """With `fastmcp_tasks` on (the extension declared) while the server's Tasks kill switch is on."""
    import fastmcp_tasks

    seen: dict[str, Any] = {"fastmcp_tasks": fastmcp_tasks.__version__}
    async with connect(url, token) as client:
        report = await client.call_tool("generate_report", {"account": "acme", "months": 2})
        seen["report"] = report.structured_content
        handed = (await client.call_tool("deploy_release", {"version": "5.0"})).structured_content or {}
        seen["deploy_handoff"] = {key: handed.get(key) for key in ("status", "job", "next")}
        seen["deploy_has_handle"] = bool(handed.get("handle"))
    return seen


async def quick_in_the_first_response(url: str, token: str) -> dict[str, Any]:
    """With `fastmcp_tasks` on, against bench.app's `work_inline` (`task_after` 1 s): a call whose job ends
    that soon is answered with its result, one that takes longer becomes a task."""
    import fastmcp_tasks
    from fastmcp_tasks import call_tool_task

    seen: dict[str, Any] = {"fastmcp_tasks": fastmcp_tasks.__version__}
    async with connect(url, token) as client:
        # The plain call a FastMCP user makes takes either answer.
        seen["quick"] = (await client.call_tool("work_inline", {"seconds": 0})).structured_content
        seen["slow"] = (await client.call_tool("work_inline", {"seconds": 1.5})).structured_content
        # The explicit task API: a job that outlasts task_after is a task...
        slow = await call_tool_task(client, "work_inline", {"seconds": 1.5})
        seen["slow_task_id"] = slow.task_id
        seen["slow_task"] = (await slow.result()).structured_content
        # ...and one that ends at once is not: fastmcp-tasks' call_tool_task refuses a result for a task.
        try:
            quick = await call_tool_task(client, "work_inline", {"seconds": 0})
            seen["explicit_quick"] = {"task_id": quick.task_id}
        except Exception as exc:
            seen["explicit_quick"] = {"raised": type(exc).__name__, "message": str(exc)}
    return seen


MODES = {
    "tasks": with_tasks,
    "plain": without_tasks,
    "tasks-off": tasks_switched_off,
    "task-after": quick_in_the_first_response,
}


def main() -> None:
    url, token, mode = sys.argv[1:4]
    run = MODES[mode]
    print(json.dumps(asyncio.run(run(url, token))))


if __name__ == "__main__":
    main()
