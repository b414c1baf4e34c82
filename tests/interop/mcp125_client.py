"""The official Python SDK 1.25 against the example server: the 2025-11-25 experimental Tasks design.

Runs in tests/interop/.venv-mcp125 (`mcp==1.25.0`), never in the project's environment:

    tests/interop/.venv-mcp125/bin/python tests/interop/mcp125_client.py URL TOKEN OTHER_TOKEN

Connects with `initialize` (2025-11-25) over Streamable HTTP as TOKEN's principal: reads the tasks
capability and the tools' `execution`, follows a report through `tasks/get` and `tasks/result`,
cancels an export (and again, once ended), answers a deployment's question with
`deploy_release_respond` and another's through its elicitation handler while `tasks/result` waits
(noting the `notifications/tasks/status` that stream carries), lists its tasks; then, as OTHER_TOKEN's principal, tries
the first principal's tasks and a made-up id. Prints what it saw as one JSON object on stdout.
With `--stdio SERVER` (its `StdioServerParameters` as JSON) it answers a deployment's question over stdio.
With `--nodes TOKEN URL FROM [--hold]` it reads a deployment's question through `tasks/result` on URL and answers
it through its elicitation handler (`--hold`: prints what it saw once asked and leaves the question open while it
lives); FROM is another node's URL to create the deployment on first, or the taskId of one created before.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.exceptions import McpError
from mcp.types import CallToolResult, ElicitRequestParams, ElicitResult, ServerNotification


def session(url: str, token: str) -> Any:
    return streamablehttp_client(url, headers={"Authorization": f"Bearer {token}"})


def refusal(error: McpError) -> dict[str, Any]:
    return {"code": error.error.code, "message": error.error.message}


async def attempt(call: Any) -> Any:
    try:
        answer = await call
    except McpError as error:
        return {"error": refusal(error)}
    return answer.model_dump(mode="json", by_alias=True, exclude_none=True)


def answering(seen: dict[str, Any], environment: str, hold: bool = False) -> Any:
    """An elicitation handler noting each question in `seen["asked"]` and approving it for `environment`;
    with `hold`, it prints `seen` and never answers."""

    async def answer(context: Any, params: ElicitRequestParams) -> ElicitResult:
        asked = params.model_dump(mode="json", by_alias=True, exclude_none=True)
        seen["asked"].append({"id": context.request_id, **asked})
        if hold:
            print(json.dumps(seen), flush=True)
            await asyncio.Event().wait()
        return ElicitResult(action="accept", content={"approve": True, "environment": environment})

    return answer


async def as_owner(url: str, token: str) -> dict[str, Any]:
    seen: dict[str, Any] = {"asked": [], "statuses": []}

    async def note(message: Any) -> None:
        if isinstance(message, ServerNotification) and message.root.method == "notifications/tasks/status":
            seen["statuses"].append(message.root.params.model_dump(mode="json", by_alias=True))

    async with (
        session(url, token) as (read, write, _),
        ClientSession(
            read, write, elicitation_callback=answering(seen, "production"), message_handler=note
        ) as client,
    ):
        init = await client.initialize()
        seen["protocol"] = init.protocolVersion
        seen["capabilities"] = init.capabilities.model_dump(mode="json", by_alias=True, exclude_none=True)
        tools = (await client.list_tools()).tools
        seen["execution"] = {
            tool.name: tool.execution.taskSupport if tool.execution else None for tool in tools
        }
        experimental = client.experimental
        created = await experimental.call_tool_as_task("generate_report", {"account": "acme", "months": 2})
        seen["created"] = created.model_dump(mode="json", by_alias=True, exclude_none=True)
        task_id = created.task.taskId
        seen["got"] = (await experimental.get_task(task_id)).model_dump(mode="json", by_alias=True)
        result = await experimental.get_task_result(task_id, CallToolResult)
        seen["result"] = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        seen["ended"] = (await experimental.get_task(task_id)).status
        export = await experimental.call_tool_as_task("export_dataset", {"rows": 1000})
        seen["export_id"] = export.task.taskId
        cancelled = await experimental.cancel_task(export.task.taskId)
        seen["cancelled"] = cancelled.model_dump(mode="json", by_alias=True, exclude_none=True)
        seen["cancel_again"] = await attempt(experimental.cancel_task(export.task.taskId))
        seen["cancelled_result"] = await attempt(
            experimental.get_task_result(export.task.taskId, CallToolResult)
        )
        deploy = (await experimental.call_tool_as_task("deploy_release", {"version": "2.0.0"})).task.taskId
        async for state in experimental.poll_task(deploy):
            if (
                state.status == "input_required"
            ):  # answered through the handle tools: the taskId is the handle
                answer = {"approve": True, "environment": "staging"}
                await client.call_tool(
                    "deploy_release_respond", {"handle": deploy, "responses": {"q1": answer}}
                )
        seen["deployed"] = (await experimental.get_task_result(deploy, CallToolResult)).structuredContent
        # Asked on the tasks/result stream, answered by the elicitation handler, on another request.
        elicited = (await experimental.call_tool_as_task("deploy_release", {"version": "3.0.0"})).task.taskId
        seen["elicited_id"] = elicited
        result = await experimental.get_task_result(elicited, CallToolResult)
        seen["elicited"] = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        listed = await experimental.list_tasks()
        seen["listed"] = [task.taskId for task in listed.tasks]
        seen["plain"] = (await client.call_tool("lookup_account", {"account": "acme"})).structuredContent
    return seen


async def as_other(url: str, token: str, task_id: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    async with session(url, token) as (read, write, _), ClientSession(read, write) as client:
        await client.initialize()
        experimental = client.experimental
        for name, probe in (("foreign", task_id), ("made_up", task_id[:-4] + "AAAA")):
            seen[name] = {
                "get": await attempt(experimental.get_task(probe)),
                "result": await attempt(experimental.get_task_result(probe, CallToolResult)),
                "cancel": await attempt(experimental.cancel_task(probe)),
            }
        seen["listed"] = [task.taskId for task in (await experimental.list_tasks()).tasks]
    return seen


async def over_stdio(server: dict[str, Any]) -> dict[str, Any]:
    """A deployment's question over stdio, where the answer comes back on the same pipe."""
    seen: dict[str, Any] = {"asked": []}
    async with (
        stdio_client(StdioServerParameters(**server)) as (read, write),
        ClientSession(read, write, elicitation_callback=answering(seen, "staging")) as client,
    ):
        await client.initialize()
        created = await client.experimental.call_tool_as_task("deploy_release", {"version": "7.0.0"})
        seen["task_id"] = created.task.taskId
        result = await client.experimental.get_task_result(created.task.taskId, CallToolResult)
        seen["deployed"] = result.structuredContent
    return seen


async def across_nodes(token: str, url: str, origin: str, hold: bool) -> dict[str, Any]:
    """A deployment created on the node at `origin` (or `origin`, a taskId), its question read and answered
    through `tasks/result` on a new session with the node at `url`."""
    seen: dict[str, Any] = {"asked": [], "taskId": origin}
    if origin.startswith("http"):
        async with session(origin, token) as (read, write, _), ClientSession(read, write) as creator:
            await creator.initialize()
            created = await creator.experimental.call_tool_as_task("deploy_release", {"version": "8.0.0"})
            seen["taskId"] = created.task.taskId
    async with (
        session(url, token) as (read, write, _),
        ClientSession(read, write, elicitation_callback=answering(seen, "production", hold)) as client,
    ):
        await client.initialize()
        result = await client.experimental.get_task_result(seen["taskId"], CallToolResult)
        seen["result"] = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    return seen


async def main(url: str, token: str, other_token: str) -> None:
    seen = await as_owner(url, token)
    seen["other"] = await as_other(url, other_token, seen["created"]["task"]["taskId"])
    print(json.dumps(seen))


if __name__ == "__main__":
    if sys.argv[1] == "--stdio":  # --stdio SERVER: StdioServerParameters as JSON
        print(json.dumps(asyncio.run(over_stdio(json.loads(sys.argv[2])))))
    elif sys.argv[1] == "--nodes":  # --nodes TOKEN URL FROM [--hold]
        print(json.dumps(asyncio.run(across_nodes(*sys.argv[2:5], hold="--hold" in sys.argv))))
    else:
        asyncio.run(main(*sys.argv[1:4]))
