"""One spelling per handle, through the example server over Streamable HTTP: a handle with whitespace
around it (or any other altered spelling) opens nothing, and gets exactly the answer a made-up one gets,
on every handle tool and on the Tasks face, whose task id is the same handle."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx2

from tests.support import TOKENS, HttpExampleServer, ToolClient, token_of
from tests.tasks.wire import Wire

MADE_UP = "not-a-real-handle"
WHITESPACE = (" ", "\t", "\n", "\r", "\r\n", "\x0b", "\x0c", "  ")


def whitespace_spellings(handle: str) -> list[str]:
    """The handle with whitespace before it, after it, and on both sides."""
    return [
        spelled
        for space in WHITESPACE
        for spelled in (space + handle, handle + space, space + handle + space)
    ]


async def start(client: ToolClient, job: str, **arguments: object) -> str:
    reply = await client.call(f"{job}_start", arguments)
    assert not reply.is_error, reply.data
    return str(reply["handle"])


async def test_a_handle_with_whitespace_around_it_is_refused_like_a_made_up_one(
    as_principal: Callable[[str], Any],
) -> None:
    async with as_principal("alice") as alice:
        report = await start(alice, "generate_report", account="acme", months=12)
        deploy = await start(alice, "deploy_release", version="4.0.0")
        await alice.wait_status("deploy_release", deploy, "input_required")
        answer = {"responses": {"q1": {"approve": True, "environment": "staging"}}}
        for tool, handle, extra in (
            ("generate_report_progress", report, {}),
            ("generate_report_fetch", report, {}),
            ("generate_report_cancel", report, {}),
            ("deploy_release_progress", deploy, {}),
            ("deploy_release_fetch", deploy, {}),
            ("deploy_release_respond", deploy, answer),
            ("deploy_release_cancel", deploy, {}),
        ):
            made_up = await alice.call(tool, {"handle": MADE_UP, **extra})
            assert made_up.is_error and made_up["error"] == "unknown_handle", tool
            for spelled in whitespace_spellings(handle):
                reply = await alice.call(tool, {"handle": spelled, **extra})
                assert reply.text == made_up.text, f"{tool} opened the job with {spelled!r}"
        # Nothing reached either job: the report was not cancelled, the question was not answered.
        report_now = await alice.call("generate_report_progress", {"handle": report})
        assert report_now["status"] in ("working", "completed")
        asked = await alice.call("deploy_release_progress", {"handle": deploy})
        assert asked["status"] == "input_required" and list(asked["input_requests"]) == ["q1"]
        cancelled = await alice.call("deploy_release_cancel", {"handle": deploy})
        assert cancelled["cancel_requested"] is True, "the exact handle still opens the job"


async def test_a_task_id_with_whitespace_around_it_is_refused_like_a_made_up_one(
    http_auth_example: HttpExampleServer,
) -> None:
    """tasks/get, tasks/update and tasks/cancel open the job by the same handle: the same one spelling.
    (No Mcp-Name header: an HTTP header cannot carry the surrounding whitespace.)"""
    alice = token_of("alice")
    assert alice in TOKENS
    no_header: dict[str, str | None] = {"Mcp-Name": None}
    async with httpx2.AsyncClient(timeout=30) as http:
        wire = Wire(http_auth_example.url, http)
        created = await wire.tool("deploy_release", {"version": "4.1.0"}, token=alice)
        assert created.result["resultType"] == "task", created.body
        task_id = created.result["taskId"]
        await wire.until(task_id, {"input_required"}, token=alice, timeout=30)
        for method, extra in (
            ("tasks/get", {}),
            ("tasks/update", {"inputResponses": {"q1": {"action": "decline"}}}),
            ("tasks/cancel", {}),
        ):
            made_up = await wire.call(method, {"taskId": MADE_UP, **extra}, token=alice, headers=no_header)
            assert made_up.status == 400 and made_up.error["code"] == -32602, made_up.body
            for spelled in whitespace_spellings(task_id):
                reply = await wire.call(method, {"taskId": spelled, **extra}, token=alice, headers=no_header)
                assert (reply.status, reply.error) == (made_up.status, made_up.error), (method, spelled)
        still = (await wire.get(task_id, token=alice)).result
        assert still["status"] == "input_required", "no declined answer and no cancel reached the job"
        assert (await wire.call("tasks/cancel", {"taskId": task_id}, token=alice)).status == 200
