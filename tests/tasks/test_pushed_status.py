"""Pushed task status: `notifications/tasks` on a `subscriptions/listen` stream that names `taskIds`
(ext-tasks `specification/draft/tasks.md`, "Task Status Notifications"), over Streamable HTTP against
the example server in a subprocess, read raw and through the official client (`TasksClientExtension`,
`follow`)."""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client

from handles import Handles, streamable_http_app
from handles.client import follow
from handles.client.tasks import TasksClientExtension
from tests.harness.client import mcp_over_http
from tests.support import HttpExampleServer, free_port
from tests.tasks.app import build_test_server
from tests.tasks.wire import ThreadedServer, Wire, example_on_each_framework

pytestmark = pytest.mark.timeout(120)

TOKENS = {"push-alice-token-7a41": "alice", "push-bob-token-2e90": "bob"}
ALICE, BOB = list(TOKENS)
SUBSCRIPTION = "io.modelcontextprotocol/subscriptionId"
MADE_UP = "WzEsIm5vdC1hLWpvYiIsImV4cG9ydF9kYXRhc2V0IiwxNzk2MTkxOTE2LCJ4Il0.bm90LWEtc2lnbmF0dXJl"


example = example_on_each_framework("example-push", TOKENS)


@pytest.fixture
async def wire(example: HttpExampleServer) -> AsyncIterator[Wire]:
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=60)) as http:
        yield Wire(example.url, http)


def tasks_frames(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [frame["params"] for frame in frames if frame.get("method") == "notifications/tasks"]


def ended(frame: dict[str, Any]) -> bool:
    return frame.get("method") == "notifications/tasks" and frame["params"]["status"] in (
        "completed",
        "failed",
        "cancelled",
    )


@asynccontextmanager
async def counted_client(
    url: str, token: str | None, **options: Any
) -> AsyncIterator[tuple[Client, Counter[str]]]:
    """The official client over Streamable HTTP, counting the requests it sends by `Mcp-Method`."""
    sent: Counter[str] = Counter()

    async def count(request: httpx2.Request) -> None:
        sent[request.headers.get("mcp-method", "?")] += 1

    async with mcp_over_http(url, token, timeout=60, on_request=count, **options) as client:
        yield client, sent


async def test_the_stream_pushes_each_state_as_tasks_get_answers_it_and_ends_with_the_result(
    wire: Wire,
) -> None:
    task_id = (await wire.tool("export_dataset", {"rows": 1000}, token=ALICE)).result["taskId"]
    reply = await wire.listen({"taskIds": [task_id]}, token=ALICE, until=ended)
    assert reply.status == 200
    ack, *rest = reply.notifications
    assert ack["method"] == "notifications/subscriptions/acknowledged"
    assert ack["params"]["notifications"] == {"taskIds": [task_id]}
    subscription = ack["params"]["_meta"][SUBSCRIPTION]
    assert {frame["method"] for frame in rest} == {"notifications/tasks"}  # no progress, no log messages
    pushed = tasks_frames(rest)
    assert all(state["_meta"][SUBSCRIPTION] == subscription and "resultType" not in state for state in pushed)
    assert [state["taskId"] for state in pushed] == [task_id] * len(pushed)
    assert len(pushed) >= 3, pushed  # the state at the acknowledgement, progress, the end
    assert pushed[-1]["status"] == "completed"
    assert all(state["status"] == "working" for state in pushed[:-1])
    progress = [state["_meta"].get("io.github.handles/progress") for state in pushed[:-1]]
    done = [numbers["done"] for numbers in progress if numbers]
    assert done and done == sorted(done)
    # The last push is what tasks/get answers now (less resultType and the server's _meta stamp).
    got = (await wire.get(task_id, token=ALICE)).result
    for key in ("taskId", "status", "statusMessage", "createdAt", "lastUpdatedAt", "ttlMs", "result"):
        assert pushed[-1][key] == got[key], key
    assert pushed[-1]["result"]["structuredContent"]["summary"].startswith("1000 rows")  # the CSV's link


async def test_a_finished_task_is_pushed_once_at_the_acknowledgement(wire: Wire) -> None:
    task_id = (await wire.tool("export_dataset", {"rows": 10}, token=ALICE)).result["taskId"]
    await wire.until(task_id, {"completed"}, token=ALICE)
    reply = await wire.listen({"taskIds": [task_id]}, token=ALICE, seconds=1.5)
    assert [state["status"] for state in tasks_frames(reply.notifications)] == ["completed"]


async def test_unknown_and_foreign_task_ids_are_left_out_alike_and_never_pushed(wire: Wire) -> None:
    mine = (await wire.tool("export_dataset", {"rows": 1000}, token=ALICE)).result["taskId"]
    bobs = (await wire.tool("export_dataset", {"rows": 1000}, token=BOB)).result["taskId"]
    both = await wire.listen({"taskIds": [MADE_UP, bobs, mine, mine]}, token=ALICE, until=ended)
    assert both.notifications[0]["params"]["notifications"] == {"taskIds": [mine]}
    assert {state["taskId"] for state in tasks_frames(both.notifications)} == {mine}

    async def cancel_it(_ack: dict[str, Any]) -> None:
        await wire.call("tasks/cancel", {"taskId": mine}, token=ALICE)

    # Bob names Alice's task: acknowledged exactly as a made-up id is, and told nothing while it changes.
    mine = (await wire.tool("export_dataset", {"rows": 1000}, token=ALICE)).result["taskId"]
    foreign = await wire.listen({"taskIds": [mine]}, token=BOB, seconds=2.0, on_ack=cancel_it)
    made_up = await wire.listen({"taskIds": [MADE_UP]}, token=BOB, seconds=0.5)
    for reply in (foreign, made_up):
        assert reply.status == 200
        assert [frame["method"] for frame in reply.notifications] == [
            "notifications/subscriptions/acknowledged"
        ]
        assert reply.notifications[0]["params"]["notifications"] == {}
    assert (await wire.until(mine, {"cancelled"}, token=ALICE))["status"] == "cancelled"


async def test_task_ids_need_the_extension_and_a_list_of_strings(wire: Wire) -> None:
    task_id = (await wire.tool("export_dataset", {"rows": 10}, token=ALICE)).result["taskId"]
    undeclared = await wire.listen({"taskIds": [task_id]}, token=ALICE, declare=False)
    assert undeclared.body["error"]["code"] == -32021
    assert undeclared.body["error"]["data"] == {
        "requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}
    }
    malformed = await wire.listen({"taskIds": task_id}, token=ALICE)
    assert malformed.body["error"]["code"] == -32602
    # Without taskIds the stream is the SDK's own, declared or not.
    plain = await wire.listen({"toolsListChanged": True}, token=ALICE, declare=False, seconds=0.5)
    assert plain.notifications[0]["params"]["notifications"] == {"toolsListChanged": True}


async def test_the_tasks_client_follows_pushes_instead_of_polling(example: HttpExampleServer) -> None:
    async with counted_client(example.url, ALICE, extensions=[TasksClientExtension()]) as (client, sent):
        result = await client.call_tool("generate_report", {"account": "acme", "months": 4})
    assert result.structured_content is not None and result.structured_content["months"] == 4
    assert sent["subscriptions/listen"] == 1
    assert sent["tasks/get"] == 0, sent

    async with counted_client(example.url, ALICE, extensions=[TasksClientExtension(push=False)]) as (
        client,
        sent,
    ):
        result = await client.call_tool("generate_report", {"account": "acme", "months": 4})
    assert result.structured_content is not None and result.structured_content["months"] == 4
    assert sent["subscriptions/listen"] == 0
    assert sent["tasks/get"] >= 1


async def test_follow_on_the_tasks_face_uses_pushes_and_answers_questions(example: HttpExampleServer) -> None:
    seen: list[str] = []
    with tempfile.TemporaryDirectory() as journal:
        async with counted_client(example.url, ALICE, extensions=[TasksClientExtension()]) as (client, sent):
            deployed = await follow(
                client,
                "deploy_release",
                {"version": "9.9.9"},
                prefer="tasks",
                journal=Path(journal) / "journal.db",
                on_input=lambda _key, _message, _schema: {"approve": True, "environment": "staging"},
                on_progress=lambda update: seen.append(update.status),
            )
    assert deployed["environment"] == "staging"
    assert "input_required" in seen and seen[-1] == "completed"
    assert sent["subscriptions/listen"] == 1 and sent["tasks/update"] == 1
    assert sent["tasks/get"] == 0, sent


async def test_a_server_that_does_not_push_is_polled(local_jobs: Handles) -> None:
    """The SDK's listen stream without the middleware acknowledges no taskIds: the client polls."""
    server = build_test_server(local_jobs)
    server.middleware.remove(local_jobs.tasks_extension().status_push)
    threaded = ThreadedServer(streamable_http_app(server, local_jobs), free_port()).start()
    try:
        async with counted_client(threaded.url, None, extensions=[TasksClientExtension()]) as (client, sent):
            with anyio.fail_after(30):
                result = await client.call_tool("slow", {"seconds": 0.6})
        assert result.structured_content == {"steps": 10}
        assert sent["subscriptions/listen"] == 1
        assert sent["tasks/get"] >= 2, sent
    finally:
        threaded.stop()


async def test_a_stream_that_ends_mid_task_falls_back_to_polling(local_server: Any) -> None:
    """The server closes its listen streams (a graceful end): the client polls tasks/get from then on."""
    from mcp.server.subscriptions import ListenHandler

    from handles.client import tasks as tasks_client

    entry = local_server._lowlevel_server.get_request_handler("subscriptions/listen")
    assert isinstance(entry.handler, ListenHandler)
    gets = 0
    real_get = tasks_client.get_task

    async def counted_get(*args: Any, **kwargs: Any) -> tasks_client.DetailedTask:
        nonlocal gets
        gets += 1
        return await real_get(*args, **kwargs)

    extension = TasksClientExtension()
    assert extension.pushes is not None
    pushes = extension.pushes
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tasks_client, "get_task", counted_get)
        async with Client(local_server, extensions=[extension]) as client, anyio.create_task_group() as group:

            async def close_streams_after_two_pushes() -> None:
                while pushes.received < 2:
                    await anyio.sleep(0.01)
                entry.handler.close()

            group.start_soon(close_streams_after_two_pushes)
            with anyio.fail_after(30):
                result = await client.call_tool("slow", {"seconds": 1.5})
    assert result.structured_content == {"steps": 10}
    assert pushes.received >= 2 and gets >= 2


def test_pushed_states_older_than_the_kept_one_or_after_the_end_are_dropped() -> None:
    from handles.client.tasks import TaskPushes, TaskStatusParams

    def state(status: str, updated: str) -> TaskStatusParams:
        return TaskStatusParams.model_validate(
            {
                "taskId": "t",
                "status": status,
                "createdAt": "2026-01-01T00:00:00.000Z",
                "lastUpdatedAt": updated,
                "_meta": {SUBSCRIPTION: 1},
            }
        )

    async def main() -> None:
        pushes = TaskPushes()
        await pushes.deliver(state("working", "2026-01-01T00:00:01.000Z"))
        assert pushes.latest("t") is None  # nobody follows t
        with pushes.watching("t"):
            await pushes.deliver(state("working", "2026-01-01T00:00:02.000Z"))
            await pushes.deliver(state("working", "2026-01-01T00:00:01.000Z"))  # late, older
            latest = pushes.latest("t")
            assert latest is not None and latest.last_updated_at.endswith("02.000Z")
            await pushes.deliver(state("completed", "2026-01-01T00:00:03.000Z"))
            await pushes.deliver(state("working", "2026-01-01T00:00:03.000Z"))  # same moment, after the end
            latest = pushes.latest("t")
            assert latest is not None and latest.status == "completed"
            with anyio.fail_after(1):
                assert (await pushes.changed("t", None)).status == "completed"
        assert pushes.latest("t") is None  # forgotten once nobody follows it

    anyio.run(main)
