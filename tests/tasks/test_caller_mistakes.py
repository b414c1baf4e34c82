"""Caller mistakes on the raw wire: argument mistakes, deep nesting and re-spelled ids, on both faces."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer

from tests.support import same_bytes_spellings
from tests.tasks.conftest import ALICE
from tests.tasks.test_wire_http import create, input_requests
from tests.tasks.wire import Wire

DEPTH = 255


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def caller_error(result: dict[str, Any]) -> dict[str, Any]:
    """The `{error, message, next}` body of a tool error result (text only, no structured content)."""
    assert result["isError"] is True and "structuredContent" not in result, result
    body: dict[str, Any] = json.loads(result["content"][0]["text"])
    assert {"error", "message", "next"} <= body.keys(), body
    return body


async def test_a_deeply_nested_answer_is_refused_cleanly_on_both_faces(
    wire: Wire, caplog: pytest.LogCaptureFixture
) -> None:
    task = await create(wire, "ask_two", {"topic": "deep"})
    task_id = task["taskId"]
    await input_requests(wire, task_id, 2)
    with caplog.at_level(logging.INFO):
        tool = await wire.tool(
            "ask_two_respond", {"handle": task_id, "responses": {"q1": nested(DEPTH)}}, token=ALICE
        )
    assert tool.status == 200
    body = caller_error(tool.result)
    assert body["error"] == "invalid_arguments"
    assert "nested" in body["message"] and "ask_two_respond" in body["next"]
    assert not [r for r in caplog.records if r.exc_info], "no traceback in the log"
    update = await wire.call(
        "tasks/update",
        {"taskId": task_id, "inputResponses": {"q1": {"action": "accept", "content": nested(DEPTH)}}},
        token=ALICE,
    )
    assert update.status == 400 and update.error["code"] == -32602
    got = (await wire.get(task_id, token=ALICE)).result
    assert got["status"] == "input_required" and set(got["inputRequests"]) == {"q1", "q2"}, "nothing stored"
    await wire.call("tasks/cancel", {"taskId": task_id}, token=ALICE)


@pytest.mark.parametrize("declare", [True, False])
async def test_unknown_and_mistyped_arguments_of_the_plain_tool_are_refused_not_run(
    wire: Wire, declare: bool
) -> None:
    for arguments, expected in (
        ({"text": "hi", "txet": "typo"}, "no argument named txet; it accepts text"),
        ({"text": 5}, "text: should be a valid string"),
        ({}, "text is required"),
    ):
        reply = await wire.tool("quick", arguments, token=ALICE, declare=declare)
        assert reply.status == 200 and reply.result["resultType"] == "complete"
        assert "taskId" not in reply.result, "refused, not turned into a task"
        body = caller_error(reply.result)
        assert body["error"] == "invalid_arguments" and expected in body["message"], body
        assert "all quick again with text (string, required)" in body["next"]
        assert "pydantic" not in reply.result["content"][0]["text"]
        valid = await wire.tool("quick", {"text": "hi"}, token=ALICE, declare=False)
        assert reply.result["_meta"] == valid.result["_meta"], "the same envelope as any other result"


async def test_the_listing_closes_every_generated_input_schema(wire: Wire) -> None:
    tools = {tool["name"]: tool for tool in (await wire.call("tools/list", {}, token=ALICE)).result["tools"]}
    generated = [name for name in tools if name.startswith(("quick", "slow", "ask_two"))]
    assert len(generated) >= 10
    for name in generated:
        assert tools[name]["inputSchema"]["additionalProperties"] is False, name


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_handshake_client_and_a_2026_client_get_the_same_refusal(
    local_server: MCPServer[Any], mode: str
) -> None:
    async with Client(local_server, mode=mode) as client:  # type: ignore[arg-type]
        typo = await client.call_tool("quick", {"text": "hi", "txet": "typo"})
        assert typo.is_error and typo.structured_content is None
        body = json.loads(typo.content[0].text)  # type: ignore[union-attr]
        assert body["error"] == "invalid_arguments" and body["accepted"] == ["text"]
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert listed["quick_start"].input_schema["additionalProperties"] is False
        assert (await client.call_tool("quick", {"text": "hi"})).structured_content == {
            "text": "hi",
            "length": 2,
        }


async def test_a_re_spelled_task_id_gets_the_same_32602_as_a_made_up_one(wire: Wire) -> None:
    made_up = await wire.get("not-a-task", token=ALICE)
    task = await create(wire, "ask_two", {"topic": "spelling"})
    for respelled in same_bytes_spellings(task["taskId"]):
        for method, params in [
            ("tasks/get", {"taskId": respelled}),
            ("tasks/update", {"taskId": respelled, "inputResponses": {"q2": {"action": "decline"}}}),
            ("tasks/cancel", {"taskId": respelled}),
        ]:
            reply = await wire.call(method, params, token=ALICE)
            assert reply.status == 400 and reply.error == made_up.error, (method, reply.body)
    still = (await wire.get(task["taskId"], token=ALICE)).result
    assert still["status"] in ("working", "input_required"), "nothing reached the job"
    await wire.call("tasks/cancel", {"taskId": task["taskId"]}, token=ALICE)
