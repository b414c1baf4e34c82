"""The same rules through the official `mcp` client: `TasksClientExtension` resolving tasks, the two
faces on one job, a 2025-era handshake client and a 2026 client without the extension on one server,
and principal isolation over HTTP with bearer tokens."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import ElicitRequest, ElicitRequestParams, ElicitResult, ErrorData, InputRequest

import handles.client.tasks as tasks_client
from handles import Handles
from handles.client import TaskCancelled, TaskFailed, TasksClientExtension, cancel_task, follow_task, get_task
from handles.client.tasks import CreateTaskResult
from tests.harness.client import abandon_once, mcp_over_http
from tests.support import count_active
from tests.tasks.conftest import ALICE, BOB
from tests.tasks.wire import ThreadedServer

pytestmark = pytest.mark.timeout(90)


async def answer_form(_context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
    message = getattr(params, "message", "")
    if "colour" in message:
        return ElicitResult(action="accept", content={"color": "teal"})
    return ElicitResult(action="accept", content={"confirm": True})


@asynccontextmanager
async def over_http(url: str, token: str, **options: Any) -> AsyncIterator[Client]:
    async with mcp_over_http(url, token, timeout=30, **options) as client:
        yield client


class RecordingTasks(TasksClientExtension):
    """Remembers the task ids it was handed, so a test can look at them afterwards."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.task_ids: list[str] = []

    async def _resolve(self, created: CreateTaskResult, ctx: Any) -> Any:
        self.task_ids.append(created.task_id)
        return await super()._resolve(created, ctx)


# -- 7. the client extension --------------------------------------------------------------------


async def test_call_tool_resolves_a_task_to_the_jobs_result(local_server: MCPServer[Any]) -> None:
    extension = RecordingTasks()
    async with Client(local_server, extensions=[extension]) as client:
        claimed = await client.session.call_tool("quick", {"text": "sdk"}, allow_claimed=True)
        assert isinstance(claimed, CreateTaskResult)
        assert claimed.status == "working" and claimed.ttl_ms == 86_400_000
        result = await client.call_tool("quick", {"text": "sdk"})
    assert extension.task_ids, "the call did not become a task"
    assert result.is_error is False
    assert result.structured_content == {"text": "sdk", "length": 3}


async def test_input_requests_are_answered_through_the_clients_elicitation_callback(
    local_server: MCPServer[Any],
) -> None:
    async with Client(
        local_server, extensions=[TasksClientExtension()], elicitation_callback=answer_form
    ) as client:
        result = await client.call_tool("ask_two", {"topic": "paint"})
    assert result.structured_content == {"color": "teal", "confirm": True}


async def test_an_on_input_handler_takes_precedence(local_server: MCPServer[Any]) -> None:
    seen: list[str] = []

    async def on_input(key: str, request: InputRequest) -> ElicitResult:
        assert isinstance(request, ElicitRequest)
        seen.append(key)
        content = {"color": "plum"} if key == "q1" else {"confirm": False}
        return ElicitResult(action="accept", content=content)

    async with Client(local_server, extensions=[TasksClientExtension(on_input=on_input)]) as client:
        result = await client.call_tool("ask_two", {"topic": "ink"})
    assert sorted(seen) == ["q1", "q2"]  # each key answered once, however often it was polled
    assert result.structured_content == {"color": "plum", "confirm": False}


async def test_outcomes_tool_error_failed_and_cancelled(local_server: MCPServer[Any]) -> None:
    async with Client(local_server, extensions=[TasksClientExtension()]) as client:
        tool_error = await client.call_tool("tool_error", {})
        assert tool_error.is_error is True
        with pytest.raises(TaskFailed) as failed:
            await client.call_tool("failing", {})
        assert failed.value.error.code == -32603
        assert failed.value.error.message == "The upstream service refused the request."

        created = await client.session.call_tool("slow", {"seconds": 10}, allow_claimed=True)
        assert isinstance(created, CreateTaskResult)
        await cancel_task(client.session, created.task_id)
        with pytest.raises(TaskCancelled):
            await follow_task(client.session, created)


async def test_a_refused_input_request_cancels_the_task(local_server: MCPServer[Any]) -> None:
    async def refuse(_context: ClientRequestContext, _params: ElicitRequestParams) -> ErrorData:
        return ErrorData(code=-32600, message="no user here")

    extension = RecordingTasks()
    async with Client(local_server, extensions=[extension], elicitation_callback=refuse) as client:
        with pytest.raises(MCPError):
            await client.call_tool("ask_two", {"topic": "nobody"})
        state = await get_task(client.session, extension.task_ids[0])
        for _ in range(100):
            if state.status == "cancelled":
                break
            await anyio.sleep(0.05)
            state = await get_task(client.session, extension.task_ids[0])
    assert state.status == "cancelled"


async def test_a_declined_elicitation_cancels_the_task(local_server: MCPServer[Any]) -> None:
    async def decline(_context: ClientRequestContext, _params: ElicitRequestParams) -> ElicitResult:
        return ElicitResult(action="decline")

    async with Client(
        local_server, extensions=[TasksClientExtension()], elicitation_callback=decline
    ) as client:
        with pytest.raises(TaskCancelled):
            await client.call_tool("ask_two", {"topic": "no thanks"})


async def test_abandoning_the_call_cancels_the_task(local_server: MCPServer[Any]) -> None:
    extension = RecordingTasks()
    async with Client(local_server, extensions=[extension]) as client:
        await abandon_once(
            lambda: client.call_tool("slow", {"seconds": 10}), lambda: bool(extension.task_ids)
        )
        assert len(extension.task_ids) == 1
        for _ in range(200):
            state = await get_task(client.session, extension.task_ids[0])
            if state.status != "working":
                break
            await anyio.sleep(0.05)
    assert state.status == "cancelled"


async def test_polling_honours_poll_interval_ms(
    local_server: MCPServer[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    polls: list[float] = []
    real_get = tasks_client.get_task

    async def timed_get(*args: Any, **kwargs: Any) -> tasks_client.DetailedTask:
        polls.append(time.monotonic())
        return await real_get(*args, **kwargs)

    monkeypatch.setattr(tasks_client, "get_task", timed_get)
    # push=False: polled even though this server pushes (tests/tasks/test_pushed_status.py)
    async with Client(local_server, extensions=[TasksClientExtension(push=False)]) as client:
        started = time.monotonic()
        await client.call_tool("slow", {"seconds": 1.0})
        elapsed = time.monotonic() - started
    gaps = [later - earlier for earlier, later in itertools.pairwise(polls)]
    assert gaps and min(gaps) >= 0.19  # pollIntervalMs is 200
    assert len(polls) <= elapsed / 0.2 + 2


# -- 3. two faces ------------------------------------------------------------------------------


async def test_two_faces_through_the_sdk(local_server: MCPServer[Any]) -> None:
    async with Client(local_server, extensions=[TasksClientExtension()]) as client:
        started = await client.call_tool("slow_start", {"seconds": 0.3})
        assert started.structured_content is not None
        handle = started.structured_content["handle"]
        result = await follow_task(client.session, handle)
        assert result.structured_content == {"steps": 10}

        created = await client.session.call_tool("slow", {"seconds": 0.3}, allow_claimed=True)
        assert isinstance(created, CreateTaskResult)
        fetched = await client.call_tool("slow_fetch", {"handle": created.task_id, "wait_seconds": 10})
        assert fetched.structured_content is not None
        assert fetched.structured_content["result"] == {"steps": 10}


# -- 1 and 6. clients that do not declare the extension, on the same server ---------------------------


async def test_a_2025_handshake_client_and_a_2026_client_without_the_extension(
    local_server: MCPServer[Any], local_jobs: Handles
) -> None:
    for mode in ["legacy", "2026-07-28"]:
        async with Client(local_server, mode=mode) as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert {"quick", "quick_start", "quick_fetch"} <= names
            quick = await client.call_tool("quick", {"text": mode})
            assert quick.structured_content == {"text": mode, "length": len(mode)}
            handoff = await client.call_tool("slow", {"seconds": 8})
            assert handoff.structured_content is not None
            handle = handoff.structured_content["handle"]
            assert handoff.structured_content["status"] == "working"
            # A 2025-11-25 client gets the older design's tasks/get (tests/interop/test_older_task_clients.py).
            if mode == "legacy":
                assert (await get_task(client.session, handle)).status == "working"
            else:
                with pytest.raises(MCPError) as refused:
                    await get_task(client.session, handle)
                assert refused.value.error.code == -32021
            await client.call_tool("slow_cancel", {"handle": handle})
            with pytest.raises(MCPError) as only:
                await client.call_tool("only_task", {})
            assert only.value.error.code == -32021


async def test_inline_runs_send_progress_notifications(local_server: MCPServer[Any]) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with Client(local_server, mode="legacy") as client:
        result = await client.call_tool("slow", {"seconds": 1.0}, progress_callback=on_progress)
    assert result.structured_content == {"steps": 10}
    assert seen and all(total == 10 for _, total, _ in seen)
    assert [p for p, _, _ in seen] == sorted({p for p, _, _ in seen})


# -- over Streamable HTTP with two principals --------------------------------------------------------


async def test_over_http_the_extension_works_and_tasks_are_private(http_server: ThreadedServer) -> None:
    async with over_http(http_server.url, ALICE, extensions=[TasksClientExtension()]) as alice:
        result = await alice.call_tool("quick", {"text": "http"})  # Mcp-Name is checked on every tasks/get
        assert result.structured_content == {"text": "http", "length": 4}
        created = await alice.session.call_tool("slow", {"seconds": 10}, allow_claimed=True)
        assert isinstance(created, CreateTaskResult)
        async with over_http(http_server.url, BOB, extensions=[TasksClientExtension()]) as bob:
            for attempt in (
                get_task(bob.session, created.task_id),
                cancel_task(bob.session, created.task_id),
                tasks_client.update_task(bob.session, created.task_id, {"q1": {"action": "decline"}}),
            ):
                with pytest.raises(MCPError) as refused:
                    await attempt
                assert refused.value.error.code == -32602
        assert (await get_task(alice.session, created.task_id)).status == "working"
        await cancel_task(alice.session, created.task_id)

    async with over_http(http_server.url, ALICE, mode="legacy") as legacy:
        quick = await legacy.call_tool("quick", {"text": "old"})
        assert quick.structured_content == {"text": "old", "length": 3}
        # The same task through the 2025-11-25 design: the same id, the caller's own.
        assert (await get_task(legacy.session, created.task_id)).task_id == created.task_id


async def test_an_abandoned_inline_call_cancels_its_job(
    local_server: MCPServer[Any], local_jobs: Handles
) -> None:
    repo = local_jobs.service.store.repo
    async with Client(local_server, mode="legacy") as client:
        await abandon_once(lambda: client.call_tool("slow", {"seconds": 10}), lambda: count_active(repo) == 1)
        for _ in range(60):  # the job only this call knew about stops at its next step, long before its 10 s
            if count_active(repo) == 0:
                break
            await anyio.sleep(0.05)
    assert count_active(repo) == 0


async def test_tasks_get_carries_numeric_progress_that_the_tasks_client_reads(
    local_server: MCPServer[Any],
) -> None:
    seen: list[tuple[str, float | None, float | None]] = []
    extension = TasksClientExtension(
        on_progress=lambda task: seen.append((task.status, task.done, task.total))
    )
    async with Client(local_server, extensions=[extension]) as client:
        result = await client.call_tool("slow", {"seconds": 1.0})
    assert result.structured_content is not None
    numbers = [(done, total) for status, done, total in seen if done is not None]
    assert numbers, seen
    assert all(total == 10 and 1 <= done <= 10 for done, total in numbers)
    assert [done for done, _ in numbers] == sorted(done for done, _ in numbers)
    assert seen[-1][0] == "completed"


async def test_questions_asked_with_gather_are_open_together_and_answered_in_any_order(
    local_server: MCPServer[Any],
) -> None:
    """`asyncio.gather` of two `ctx.ask` (the `ask_two` job): both open at once, keyed in argument order."""
    async with Client(local_server) as client:
        started = await client.call_tool("ask_two_start", {"topic": "sign"})
        handle = (started.structured_content or {})["handle"]
        with anyio.fail_after(10):
            while True:
                state = await client.call_tool("ask_two_progress", {"handle": handle, "wait_seconds": 1})
                view = state.structured_content or {}
                if len(view.get("input_requests") or {}) == 2:
                    break
        assert view["status"] == "input_required"
        assert "colour" in view["input_requests"]["q1"]["message"]
        assert "Go ahead" in view["input_requests"]["q2"]["message"]
        await client.call_tool("ask_two_respond", {"handle": handle, "responses": {"q2": {"confirm": True}}})
        left = (await client.call_tool("ask_two_progress", {"handle": handle})).structured_content or {}
        assert left["status"] == "input_required" and list(left["input_requests"]) == ["q1"]
        await client.call_tool("ask_two_respond", {"handle": handle, "responses": {"q1": {"color": "red"}}})
        done = await client.call_tool("ask_two_fetch", {"handle": handle, "wait_seconds": 10})
    assert (done.structured_content or {})["result"] == {"color": "red", "confirm": True}
