"""Every Tasks rule once over raw JSON-RPC on Streamable HTTP: field names, resultType values,
error codes, HTTP statuses and headers exactly as they travel."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import pytest
from mcp.shared.inbound import encode_header_value

from tests.tasks.app import BRIEF_RETENTION_SECONDS
from tests.tasks.conftest import ALICE, BOB
from tests.tasks.wire import TASKS, Wire

pytestmark = pytest.mark.timeout(90)

ISO_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$")
TASK_FIELDS = {"taskId", "status", "statusMessage", "createdAt", "lastUpdatedAt", "ttlMs", "pollIntervalMs"}
ONE_DAY_MS = 86_400_000
TERMINAL = {"completed", "failed", "cancelled"}
MISSING_TASKS = {"requiredCapabilities": {"extensions": {TASKS: {}}}}


def without_meta(result: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in result.items() if key != "_meta"}


async def create(wire: Wire, tool: str, arguments: dict[str, Any], token: str = ALICE) -> dict[str, Any]:
    reply = await wire.tool(tool, arguments, token=token)
    assert reply.status == 200, reply.body
    assert reply.result["resultType"] == "task", reply.body
    return reply.result


async def input_requests(wire: Wire, task_id: str, count: int) -> dict[str, Any]:
    """Wait until the task shows `count` outstanding input requests."""
    for _ in range(200):
        task = (await wire.get(task_id, token=ALICE)).result
        if task["status"] == "input_required" and len(task["inputRequests"]) == count:
            return task
        await asyncio.sleep(0.05)
    raise AssertionError(f"the task never showed {count} input requests")


# -- 1. advertise and gate ----------------------------------------------------------------


async def test_discover_advertises_the_extension_under_capabilities_extensions(wire: Wire) -> None:
    reply = await wire.call("server/discover", {}, token=ALICE, declare=False)
    capabilities = reply.result["capabilities"]
    assert capabilities["extensions"][TASKS] == {}
    assert "tasks" not in capabilities  # the 2025-11-25 slot is not used


async def test_tasks_methods_answer_32021_to_requests_that_do_not_declare_the_extension(wire: Wire) -> None:
    task = await create(wire, "slow", {"seconds": 5})
    calls = [
        ("tasks/get", {"taskId": task["taskId"]}),
        ("tasks/update", {"taskId": task["taskId"], "inputResponses": {}}),
        ("tasks/cancel", {"taskId": task["taskId"]}),
    ]
    for method, params in calls:
        reply = await wire.call(method, params, token=ALICE, declare=False)
        assert reply.status == 400
        assert reply.error["code"] == -32021
        assert reply.error["data"] == MISSING_TASKS
    # Declaring on one request does not carry over to the next: capabilities are per request.
    assert (await wire.get(task["taskId"], token=ALICE)).status == 200
    assert (await wire.get(task["taskId"], token=ALICE, declare=False)).error["code"] == -32021
    assert (await wire.get(task["taskId"], token=ALICE)).result[
        "status"
    ] == "working"  # nothing was cancelled
    await wire.call("tasks/cancel", {"taskId": task["taskId"]}, token=ALICE)


# -- 2. the plain tool and CreateTaskResult ------------------------------------------------


async def test_each_job_is_listed_as_a_plain_tool_with_its_own_parameters(wire: Wire) -> None:
    tools = {tool["name"]: tool for tool in (await wire.call("tools/list", {}, token=ALICE)).result["tools"]}
    assert set(tools["quick"]["inputSchema"]["properties"]) == {"text"}
    assert tools["quick"]["inputSchema"]["required"] == ["text"]
    assert set(tools["slow"]["inputSchema"]["properties"]) == {"seconds"}
    assert "outputSchema" not in tools["slow"]  # its plain answer is the result or a hand-off
    assert {"slow_start", "slow_progress", "slow_fetch", "slow_cancel", "ask_two_respond"} <= set(tools)


async def test_declaring_call_answers_a_flat_create_task_result_once_the_task_is_durable(wire: Wire) -> None:
    reply = await wire.tool("slow", {"seconds": 5}, token=ALICE)
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("application/json")
    task = reply.result
    assert set(task) == {"resultType", "_meta", *TASK_FIELDS}
    assert task["resultType"] == "task"
    assert task["status"] == "working"
    assert isinstance(task["statusMessage"], str)
    assert ISO_UTC.match(task["createdAt"]) and ISO_UTC.match(task["lastUpdatedAt"])
    assert task["ttlMs"] == ONE_DAY_MS
    assert task["pollIntervalMs"] == 200
    # Durable before the answer: a tasks/get right away resolves the same task.
    got = (await wire.get(task["taskId"], token=ALICE)).result
    assert got["resultType"] == "complete"
    assert got["taskId"] == task["taskId"]
    assert got["createdAt"] == task["createdAt"]
    await wire.call("tasks/cancel", {"taskId": task["taskId"]}, token=ALICE)


async def test_invalid_arguments_are_a_tool_error_not_a_task(wire: Wire) -> None:
    for declare in (True, False):
        reply = await wire.tool("slow", {"seconds": "soon"}, token=ALICE, declare=declare)
        assert reply.status == 200
        assert reply.result["resultType"] == "complete"
        assert reply.result["isError"] is True
        assert "taskId" not in reply.result


# -- 4. tasks/get by status --------------------------------------------------------------------


async def test_working_task_has_no_payload_and_reports_progress_in_status_message(wire: Wire) -> None:
    task = await create(wire, "slow", {"seconds": 4})
    for _ in range(100):
        got = (await wire.get(task["taskId"], token=ALICE)).result
        if got["statusMessage"].startswith("Step"):
            break
        await asyncio.sleep(0.05)
    assert got["status"] == "working"
    assert set(got) == {"resultType", "_meta", *TASK_FIELDS}
    assert re.match(r"Step \d+ of 10", got["statusMessage"])
    await wire.call("tasks/cancel", {"taskId": task["taskId"]}, token=ALICE)


async def test_completed_task_carries_the_call_tool_result_the_call_would_have_returned(wire: Wire) -> None:
    task = await create(wire, "quick", {"text": "hello"})
    got = await wire.until(task["taskId"], TERMINAL, token=ALICE)
    assert got["status"] == "completed"
    assert "pollIntervalMs" not in got  # nothing left to poll for
    assert got["result"]["structuredContent"] == {"text": "hello", "length": 5}
    assert got["result"]["isError"] is False
    assert json.loads(got["result"]["content"][0]["text"]) == {"text": "hello", "length": 5}
    plain = await wire.tool("quick", {"text": "hello"}, token=ALICE, declare=False)
    assert got["result"] == without_meta(plain.result)


async def test_tool_error_completes_with_is_error_true(wire: Wire) -> None:
    task = await create(wire, "tool_error", {})
    got = await wire.until(task["taskId"], TERMINAL, token=ALICE)
    assert got["status"] == "completed"
    assert got["result"]["isError"] is True
    assert got["result"]["content"] == [{"type": "text", "text": "The input was refused: nothing to do."}]
    assert "error" not in got


async def test_failed_task_carries_a_jsonrpc_error_object_and_a_status_message(wire: Wire) -> None:
    task = await create(wire, "failing", {})
    got = await wire.until(task["taskId"], TERMINAL, token=ALICE)
    assert got["status"] == "failed"
    assert got["error"]["code"] == -32603
    assert got["error"]["message"] == "The upstream service refused the request."
    assert got["statusMessage"] == "The upstream service refused the request."
    assert "result" not in got


async def test_input_required_shows_every_outstanding_request_and_update_takes_partial_answers(
    wire: Wire,
) -> None:
    task = await create(wire, "ask_two", {"topic": "tea"})
    task_id = task["taskId"]
    got = await input_requests(wire, task_id, 2)
    assert got["inputRequests"]["q1"] == {
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": "Which colour for tea?",
            "requestedSchema": {
                "type": "object",
                "properties": {
                    "color": {"type": "string", "title": "Color", "description": "Your favourite colour."}
                },
                "required": ["color"],
            },
        },
    }
    assert got["inputRequests"]["q2"]["params"]["message"] == "Go ahead with tea?"
    assert "requestState" not in got

    # An answer that does not fit its schema is refused, and nothing is stored.
    bad = await wire.call(
        "tasks/update",
        {"taskId": task_id, "inputResponses": {"q1": {"action": "accept", "content": {"color": 3}}}},
        token=ALICE,
    )
    assert bad.status == 400 and bad.error["code"] == -32602
    assert set((await wire.get(task_id, token=ALICE)).result["inputRequests"]) == {"q1", "q2"}

    # A partial answer (plus an unknown key) is acknowledged with an empty result.
    ack = await wire.call(
        "tasks/update",
        {
            "taskId": task_id,
            "inputResponses": {"q1": {"action": "accept", "content": {"color": "blue"}}, "nope": {"x": 1}},
        },
        token=ALICE,
    )
    assert ack.status == 200
    assert without_meta(ack.result) == {"resultType": "complete"}
    got = (await wire.get(task_id, token=ALICE)).result
    assert got["status"] == "input_required"
    assert set(got["inputRequests"]) == {"q2"}

    # An already answered key is ignored; the last answer lets the job finish.
    await wire.call(
        "tasks/update",
        {
            "taskId": task_id,
            "inputResponses": {
                "q1": {"action": "accept", "content": {"color": "red"}},
                "q2": {"action": "accept", "content": {"confirm": True}},
            },
        },
        token=ALICE,
    )
    done = await wire.until(task_id, TERMINAL, token=ALICE)
    assert done["status"] == "completed"
    assert done["result"]["structuredContent"] == {"color": "blue", "confirm": True}


async def test_declining_an_input_request_cancels_the_task(wire: Wire) -> None:
    task = await create(wire, "ask_two", {"topic": "coffee"})
    await input_requests(wire, task["taskId"], 2)
    ack = await wire.call(
        "tasks/update",
        {"taskId": task["taskId"], "inputResponses": {"q1": {"action": "decline"}}},
        token=ALICE,
    )
    assert without_meta(ack.result) == {"resultType": "complete"}
    assert (await wire.until(task["taskId"], TERMINAL, token=ALICE))["status"] == "cancelled"


async def test_cancel_is_an_empty_ack_and_the_same_for_a_finished_task(wire: Wire) -> None:
    task = await create(wire, "slow", {"seconds": 10})
    ack = await wire.call("tasks/cancel", {"taskId": task["taskId"]}, token=ALICE)
    assert ack.status == 200
    assert without_meta(ack.result) == {"resultType": "complete"}
    cancelled = await wire.until(task["taskId"], TERMINAL, token=ALICE)
    assert cancelled["status"] == "cancelled"
    assert set(cancelled) == {"resultType", "_meta", *TASK_FIELDS} - {"pollIntervalMs"}
    again = await wire.call("tasks/cancel", {"taskId": task["taskId"]}, token=ALICE)
    assert without_meta(again.result) == {"resultType": "complete"}

    finished = await create(wire, "quick", {"text": "done"})
    await wire.until(finished["taskId"], TERMINAL, token=ALICE)
    ack = await wire.call("tasks/cancel", {"taskId": finished["taskId"]}, token=ALICE)
    assert without_meta(ack.result) == {"resultType": "complete"}
    assert (await wire.get(finished["taskId"], token=ALICE)).result["status"] == "completed"


# -- 5. errors --------------------------------------------------------------------------------


async def test_unknown_expired_and_foreign_task_ids_get_the_same_32602(wire: Wire) -> None:
    unknown = await wire.get("not-a-task", token=ALICE)
    assert unknown.status == 400
    assert unknown.error["code"] == -32602
    message = unknown.error["message"]

    created = time.monotonic()
    expired = await create(wire, "brief", {})
    await wire.until(expired["taskId"], TERMINAL, token=ALICE)
    await asyncio.sleep(
        max(0.0, created + BRIEF_RETENTION_SECONDS + 0.2 - time.monotonic())
    )  # past its retention

    mine = await create(wire, "ask_two", {"topic": "secrets"})
    await input_requests(wire, mine["taskId"], 2)
    truncated = mine["taskId"][:-3]
    for task_id, token in [(expired["taskId"], ALICE), (truncated, ALICE), (mine["taskId"], BOB)]:
        for method, params in [
            ("tasks/get", {"taskId": task_id}),
            ("tasks/update", {"taskId": task_id, "inputResponses": {"q2": {"action": "decline"}}}),
            ("tasks/cancel", {"taskId": task_id}),
        ]:
            reply = await wire.call(method, params, token=token)
            assert reply.status == 400, (method, reply.body)
            assert reply.error == {"code": -32602, "message": message}
    # Bob's attempts changed nothing for Alice.
    still = (await wire.get(mine["taskId"], token=ALICE)).result
    assert still["status"] == "input_required"
    assert set(still["inputRequests"]) == {"q1", "q2"}
    await wire.call("tasks/cancel", {"taskId": mine["taskId"]}, token=ALICE)


async def test_tasks_result_and_tasks_list_do_not_exist(wire: Wire) -> None:
    for method, params in [("tasks/result", {"taskId": "x"}), ("tasks/list", {})]:
        reply = await wire.call(method, params, token=ALICE)
        assert reply.status == 404
        assert reply.error["code"] == -32601


async def test_a_legacy_task_param_on_tools_call_is_ignored(wire: Wire) -> None:
    legacy = {"ttl": 60_000, "pollInterval": 100}
    greeted = await wire.call(
        "tools/call", {"name": "greet", "arguments": {"name": "x"}, "task": legacy}, token=ALICE
    )
    assert greeted.status == 200
    assert greeted.result["resultType"] == "complete"
    assert greeted.result["content"][0]["text"] == "Hello, x!"
    plain = await wire.call(
        "tools/call",
        {"name": "quick", "arguments": {"text": "y"}, "task": legacy},
        token=ALICE,
        declare=False,
    )
    assert plain.result["resultType"] == "complete"
    assert "taskId" not in plain.result


async def test_an_mcp_name_header_that_differs_from_the_task_id_is_refused(wire: Wire) -> None:
    task = await create(wire, "quick", {"text": "headers"})
    for header in ["someone-else", task["taskId"] + "x", "=?base64?!!?="]:
        for method, extra in (
            ("tasks/get", {}),
            ("tasks/update", {"inputResponses": {}}),
            ("tasks/cancel", {}),
        ):
            reply = await wire.call(
                method, {"taskId": task["taskId"], **extra}, token=ALICE, headers={"Mcp-Name": header}
            )
            assert reply.status == 400, (method, header)
            assert reply.error["code"] == -32020
    assert (await wire.get(task["taskId"], token=ALICE)).status == 200


async def test_a_missing_mcp_name_header_is_accepted_as_fastmcp_tasks_and_the_sdk_send_it(wire: Wire) -> None:
    task = await create(wire, "quick", {"text": "no header"})
    reply = await wire.get(task["taskId"], token=ALICE, headers={"Mcp-Name": None})
    assert reply.status == 200
    assert reply.result["taskId"] == task["taskId"]
    update = await wire.call(
        "tasks/update",
        {"taskId": task["taskId"], "inputResponses": {}},
        token=ALICE,
        headers={"Mcp-Name": None},
    )
    assert update.status == 200 and update.result["resultType"] == "complete"
    cancel = await wire.call(
        "tasks/cancel", {"taskId": task["taskId"]}, token=ALICE, headers={"Mcp-Name": None}
    )
    assert cancel.status == 200 and cancel.result["resultType"] == "complete"


async def test_the_mcp_name_header_is_compared_trimmed_but_the_task_id_must_be_exact(wire: Wire) -> None:
    task = await create(wire, "quick", {"text": "padded"})
    task_id = task["taskId"]
    padded_header = encode_header_value(f" {task_id}\n")  # non-ASCII-safe values travel base64-encoded
    reply = await wire.get(task_id, token=ALICE, headers={"Mcp-Name": padded_header})
    assert reply.status == 200
    assert reply.result["taskId"] == task_id
    # One spelling per handle: the header matches, and the padded taskId is refused like a made-up one.
    made_up = await wire.get("not-a-task", token=ALICE)
    padded_param = await wire.call(
        "tasks/get", {"taskId": f"{task_id} "}, token=ALICE, headers={"Mcp-Name": task_id}
    )
    assert (padded_param.status, padded_param.error) == (400, made_up.error)


async def test_tasks_get_carries_numeric_progress_in_meta_under_the_projects_key(wire: Wire) -> None:
    task = await create(wire, "slow", {"seconds": 2})
    deadline = time.monotonic() + 10
    while True:
        reply = await wire.get(task["taskId"], token=ALICE)
        progress = (reply.result.get("_meta") or {}).get("io.github.handles/progress")
        if progress is not None or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert progress is not None and progress["total"] == 10 and 1 <= progress["done"] <= 10
    assert reply.result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"]  # the SDK's stamp is kept
    await wire.call("tasks/cancel", {"taskId": task["taskId"]}, token=ALICE)


# -- 6. callers that do not declare the extension ------------------------------------------------


async def test_undeclared_call_of_a_quick_job_answers_its_result_inline(wire: Wire) -> None:
    reply = await wire.tool("quick", {"text": "inline"}, token=ALICE, declare=False)
    assert reply.status == 200
    assert reply.result["resultType"] == "complete"
    assert reply.result["structuredContent"] == {"text": "inline", "length": 6}


async def test_undeclared_call_of_a_long_job_hands_off_its_handle_with_progress_on_the_way(
    wire: Wire,
) -> None:
    reply = await wire.call(
        "tools/call",
        {"name": "slow", "arguments": {"seconds": 8}, "_meta": {"progressToken": "p-1"}},
        token=ALICE,
        declare=False,
    )
    assert reply.headers["content-type"].startswith("text/event-stream")
    progress = [n["params"] for n in reply.notifications if n["method"] == "notifications/progress"]
    assert progress and all(p["progressToken"] == "p-1" and p["total"] == 10 for p in progress)
    assert [p["progress"] for p in progress] == sorted({p["progress"] for p in progress})
    handoff = reply.result["structuredContent"]
    assert reply.result["resultType"] == "complete" and reply.result["isError"] is False
    assert handoff["status"] == "working"
    assert "slow_progress" in handoff["next"] and "slow_fetch" in handoff["next"]
    followed = await wire.tool("slow_progress", {"handle": handoff["handle"]}, token=ALICE, declare=False)
    assert followed.result["structuredContent"]["status"] == "working"
    await wire.tool("slow_cancel", {"handle": handoff["handle"]}, token=ALICE)


async def test_undeclared_call_of_a_failing_job_answers_its_jsonrpc_error(wire: Wire) -> None:
    reply = await wire.tool("failing", {}, token=ALICE, declare=False)
    assert reply.error["code"] == -32603
    assert reply.error["message"] == "The upstream service refused the request."


async def test_tasks_only_job_refuses_undeclared_calls_with_32021(wire: Wire) -> None:
    reply = await wire.tool("only_task", {}, token=ALICE, declare=False)
    assert reply.status == 400
    assert reply.error["code"] == -32021
    assert reply.error["data"] == MISSING_TASKS
    task = await create(wire, "only_task", {})
    assert (await wire.until(task["taskId"], TERMINAL, token=ALICE))["status"] == "completed"


# -- 3. one job, two faces -------------------------------------------------------------------------


async def test_a_job_started_with_the_start_tool_is_a_task_and_a_task_is_a_handle(wire: Wire) -> None:
    started = (await wire.tool("slow_start", {"seconds": 0.5}, token=ALICE, declare=False)).result
    handle = started["structuredContent"]["handle"]
    done = await wire.until(handle, TERMINAL, token=ALICE)
    fetched = (await wire.tool("slow_fetch", {"handle": handle}, token=ALICE, declare=False)).result
    assert done["status"] == "completed"
    assert done["result"]["structuredContent"] == fetched["structuredContent"]["result"] == {"steps": 10}

    task = await create(wire, "slow", {"seconds": 0.5})
    progress = (await wire.tool("slow_progress", {"handle": task["taskId"]}, token=ALICE)).result
    assert progress["structuredContent"]["status"] in {"working", "completed"}
    fetched = (
        await wire.tool("slow_fetch", {"handle": task["taskId"], "wait_seconds": 10}, token=ALICE)
    ).result
    assert fetched["structuredContent"]["result"] == {"steps": 10}

    asked = await create(wire, "ask_two", {"topic": "faces"})
    await input_requests(wire, asked["taskId"], 2)
    responses = {"q1": {"color": "green"}, "q2": {"confirm": False}}
    await wire.tool("ask_two_respond", {"handle": asked["taskId"], "responses": responses}, token=ALICE)
    done = await wire.until(asked["taskId"], TERMINAL, token=ALICE)
    assert done["result"]["structuredContent"] == {"color": "green", "confirm": False}

    other = await create(wire, "slow", {"seconds": 10})
    await wire.tool("slow_cancel", {"handle": other["taskId"]}, token=ALICE)
    assert (await wire.until(other["taskId"], TERMINAL, token=ALICE))["status"] == "cancelled"
    # Bob cannot use Alice's task id as a handle either.
    foreign = await wire.tool("slow_progress", {"handle": other["taskId"]}, token=BOB)
    assert foreign.result["isError"] is True
