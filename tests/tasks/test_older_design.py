"""The 2025-11-25 experimental Tasks design on the raw wire: what the real clients' tests
(tests/interop/test_older_task_clients.py) cannot reach with the example's jobs, and what other versions keep.

Requests go as a stateless handshake-era client sends them after `initialize`: the
`MCP-Protocol-Version: 2025-11-25` header, no `_meta` envelope.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from pathlib import Path
from typing import Any

import httpx2
import pytest

import handles.server.older_tasks as older_tasks
from handles import streamable_http_app
from handles.server.older_tasks import question_id
from tests.support import free_port
from tests.tasks.app import build_test_server, create_test_jobs, tasks_config
from tests.tasks.conftest import ALICE, BOB
from tests.tasks.wire import ThreadedServer, Wire, older_result_frames, parse_sse, post_answer

_ids = itertools.count(1)


async def older(
    http: httpx2.AsyncClient, url: str, method: str, params: dict[str, Any], *, version: str = "2025-11-25"
) -> dict[str, Any]:
    """One request as a handshake-era client at `version` sends it; the JSON-RPC response."""
    headers = {"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {ALICE}"}
    if method != "initialize":
        headers["MCP-Protocol-Version"] = version
    request = {"jsonrpc": "2.0", "id": next(_ids), "method": method, "params": params}
    response = await http.post(url, json=request, headers=headers)
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        return [m for m in parse_sse(response.text) if "id" in m][-1]
    body: dict[str, Any] = response.json()
    return body


@pytest.fixture
async def http() -> Any:
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=60)) as client:
        yield client


def initialize(version: str) -> dict[str, Any]:
    return {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "older", "version": "0"}}


async def test_only_2025_11_25_is_served_the_design(
    http: httpx2.AsyncClient, http_server: ThreadedServer
) -> None:
    url = http_server.url
    assert (await older(http, url, "initialize", initialize("2025-11-25")))["result"]["capabilities"]["tasks"]
    earlier = await older(http, url, "initialize", initialize("2025-06-18"))
    assert "tasks" not in earlier["result"]["capabilities"]
    tools = {t["name"]: t for t in (await older(http, url, "tools/list", {}))["result"]["tools"]}
    assert tools["slow"]["execution"] == {"taskSupport": "optional"}
    assert tools["only_task"]["execution"] == {"taskSupport": "required"}
    assert "execution" not in tools["greet"] and "execution" not in tools["slow_fetch"]
    earlier_tools = (await older(http, url, "tools/list", {}, version="2025-06-18"))["result"]["tools"]
    assert all("execution" not in tool for tool in earlier_tools)
    # At 2025-06-18 a params.task is not this design's: the plain call answers.
    plain = await older(
        http,
        url,
        "tools/call",
        {"name": "quick", "arguments": {"text": "x"}, "task": {}},
        version="2025-06-18",
    )
    assert plain["result"]["structuredContent"] == {"text": "x", "length": 1}
    # A 2026-07-28 request without the extension ignores it too, and gets no tasks/list.
    async with httpx2.AsyncClient(timeout=30) as raw:
        wire = Wire(url, raw)
        modern = await wire.call(
            "tools/call",
            {"name": "quick", "arguments": {"text": "y"}, "task": {}},
            token=ALICE,
            declare=False,
        )
        assert modern.result["structuredContent"] == {"text": "y", "length": 1}
        assert (await wire.call("tasks/list", {}, token=ALICE)).error["code"] == -32601


async def test_a_failed_job_s_result_is_its_json_rpc_error_and_a_tool_error_its_result(
    http: httpx2.AsyncClient, http_server: ThreadedServer
) -> None:
    url = http_server.url
    failed = (
        await older(http, url, "tools/call", {"name": "failing", "arguments": {}, "task": {"ttl": 1000}})
    )["result"]
    error = (await older(http, url, "tasks/result", {"taskId": failed["task"]["taskId"]}))["error"]
    assert "upstream service refused" in error["message"]
    assert (await older(http, url, "tasks/get", {"taskId": failed["task"]["taskId"]}))["result"][
        "status"
    ] == "failed"
    refused = (await older(http, url, "tools/call", {"name": "tool_error", "arguments": {}, "task": {}}))[
        "result"
    ]
    result = (await older(http, url, "tasks/result", {"taskId": refused["task"]["taskId"]}))["result"]
    assert result["isError"] is True and "nothing to do" in result["content"][0]["text"]


async def test_tasks_list_pages_the_caller_s_own_tasks_newest_first(
    http: httpx2.AsyncClient, http_server: ThreadedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(older_tasks, "PAGE_SIZE", 2)
    url = http_server.url
    created = []
    for _ in range(3):
        answer = await older(
            http, url, "tools/call", {"name": "quick", "arguments": {"text": "n"}, "task": {}}
        )
        created.append(answer["result"]["task"]["taskId"])
    listed: list[str] = []
    cursor: str | None = None
    for _ in range(500):
        page = (await older(http, url, "tasks/list", {"cursor": cursor} if cursor else {}))["result"]
        assert len(page["tasks"]) <= 2
        listed += [task["taskId"] for task in page["tasks"]]
        cursor = page.get("nextCursor")
        if cursor is None:
            break
    assert len(listed) == len(set(listed))
    assert [task_id for task_id in listed if task_id in created] == created[::-1]
    bad = await older(http, url, "tasks/list", {"cursor": "not-a-cursor"})
    assert bad["error"]["code"] == -32602
    async with httpx2.AsyncClient(timeout=30) as raw:  # the same tasks are not BOB's
        bob = Wire(url, raw)
        for task_id in created:
            assert (await bob.get(task_id, token=BOB)).error["code"] == -32602


async def test_while_the_kill_switch_is_on_a_task_augmented_call_gets_the_plain_answer(
    http: httpx2.AsyncClient, tmp_path: Path, tasks_key: str
) -> None:
    jobs = create_test_jobs(tasks_config(tmp_path / "data", tasks_key, tasks_off=True))
    served = ThreadedServer(streamable_http_app(build_test_server(jobs), jobs), free_port()).start()
    try:
        call = {"name": "quick", "arguments": {"text": "z"}, "task": {"ttl": 1000}}
        answer = (await older(http, served.url, "tools/call", call))["result"]
        assert "task" not in answer and answer["structuredContent"] == {"text": "z", "length": 1}
    finally:
        served.stop()


async def ask_two(http: httpx2.AsyncClient, url: str, topic: str) -> str:
    """Start `ask_two` as a 2025-11-25 task; its taskId."""
    call = {"name": "ask_two", "arguments": {"topic": topic}, "task": {}}
    task_id: str = (await older(http, url, "tools/call", call))["result"]["task"]["taskId"]
    return task_id


async def pending_keys(url: str, task_id: str) -> set[str]:
    """The task's open questions, read through the 2026-07-28 face."""
    async with httpx2.AsyncClient(timeout=30) as raw:
        return set((await Wire(url, raw).get(task_id, token=ALICE)).result.get("inputRequests", {}))


async def test_tasks_result_asks_the_job_s_questions_and_the_answers_posted_back_resume_it(
    http: httpx2.AsyncClient, http_server: ThreadedServer
) -> None:
    url = http_server.url
    task_id = await ask_two(http, url, "t")
    questions: dict[str, dict[str, Any]] = {}
    statuses: list[str] = []
    final: dict[str, Any] = {}
    answered = False
    async with contextlib.aclosing(older_result_frames(http, url, task_id, ALICE)) as frames:
        async for frame in frames:
            if frame.get("method") == "notifications/tasks/status":
                statuses.append(frame["params"]["status"])
            elif frame.get("method") == "elicitation/create":
                assert frame["params"]["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task_id}
                questions[frame["params"]["message"].split()[0]] = frame
            else:
                final = frame
                break
            if len(questions) < 2 or answered:
                continue
            answered = True
            # Another principal's answer, and an answer that does not fit: accepted on the wire, nothing stored.
            which, go = questions["Which"], questions["Go"]
            teal, misfit = ({"action": "accept", "content": {"color": c}} for c in ("teal", 7))
            assert await post_answer(http, url, which["id"], teal, BOB) == 202
            assert await post_answer(http, url, which["id"], misfit, ALICE) == 202
            assert await pending_keys(url, task_id) == {"q1", "q2"}
            assert await post_answer(http, url, which["id"], teal, ALICE) == 202
            confirm = {"action": "accept", "content": {"confirm": True}}
            assert await post_answer(http, url, go["id"], confirm, ALICE) == 202
    assert final["result"]["structuredContent"] == {"color": "teal", "confirm": True}
    assert final["result"]["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task_id}
    assert len({question["id"] for question in questions.values()}) == 2
    assert statuses[0] in ("working", "input_required") and statuses[-1] == "completed", statuses
    assert "input_required" in statuses


async def test_a_declined_question_cancels_the_task_and_a_made_up_answer_is_accepted_and_ignored(
    http: httpx2.AsyncClient, http_server: ThreadedServer
) -> None:
    url = http_server.url
    task_id = await ask_two(http, url, "d")
    for _ in range(100):
        if await pending_keys(url, task_id) == {"q1", "q2"}:
            break
        await asyncio.sleep(0.05)
    made_up = question_id("q1", task_id[:-4] + "AAAA")
    assert (
        await post_answer(http, url, made_up, {"action": "accept", "content": {"color": "red"}}, ALICE) == 202
    )
    red = {"action": "accept", "content": {"color": "red"}}
    assert (
        await post_answer(http, url, question_id("q1", task_id), red) == 401
    )  # no token: refused as any call
    assert await pending_keys(url, task_id) == {"q1", "q2"}
    assert await post_answer(http, url, question_id("q2", task_id), {"action": "decline"}, ALICE) == 202
    result = await older(http, url, "tasks/result", {"taskId": task_id})
    assert result["result"]["isError"] is True
    assert (await older(http, url, "tasks/get", {"taskId": task_id}))["result"]["status"] == "cancelled"
