"""`handles.client.follow` through the 2025-11-25 experimental Tasks design: against FastMCP 3 with
`@mcp.tool(task=True)` (tests/interop/fastmcp3_server.py, in tests/interop/.venv-fastmcp3), a server that
speaks only that design, and against the example server on a 2025-11-25 handshake, which has handle tools too.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp_types import GetTaskRequest, GetTaskRequestParams, GetTaskResult

from handles.client import (
    DeadlineExceeded,
    InputRequiredError,
    JobToolError,
    Journal,
    Progress,
    connect,
    follow,
    read_manifest,
)
from tests.harness.process import ServerProcess, free_port
from tests.interop.test_older_task_clients import FASTMCP_3, OTHER, OWNER, python_of
from tests.support import HttpExampleServer
from tests.tasks.wire import Wire, example_process

pytestmark = pytest.mark.timeout(600)  # a first run creates FastMCP 3's environment

HERE = Path(__file__).parent
FASTMCP_TASK_ID = re.compile(r"^[0-9a-f-]{36}$")


@pytest.fixture(scope="module")
def older_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    python = python_of(".venv-fastmcp3", *FASTMCP_3)
    port = free_port()
    log = tmp_path_factory.mktemp("fastmcp3-server") / "server.log"
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "PYTHONUNBUFFERED": "1"}
    server = ServerProcess(
        [python, str(HERE / "fastmcp3_server.py"), str(port)], env, log, port, name="FastMCP 3"
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def task_status(url: str, task_id: str) -> str:
    async with Client(url) as client:
        task = await client.session.send_request(
            GetTaskRequest(params=GetTaskRequestParams(task_id=task_id)), GetTaskResult
        )
    return task.status


async def test_follow_runs_a_task_of_a_server_that_speaks_only_the_2025_11_25_design(
    older_only: ServerProcess, tmp_path: Path
) -> None:
    manifest = await read_manifest(connect(older_only.url))
    assert manifest.negotiated_by == "initialize" and manifest.protocol_version == "2025-11-25"
    assert manifest.tasks_designs == ("2025-11-25",) and not manifest.tasks_usable
    assert manifest.older_task_tools == ("count_to", "publish", "refuse", "sleep_for")
    assert manifest.job("count_to") is not None and "handles" not in manifest.job("count_to").modes  # type: ignore[union-attr]

    journal = Journal(tmp_path / "follows.db")
    seen: list[Progress] = []
    result = await follow(
        connect(older_only.url), "count_to", {"n": 5}, key="count", journal=journal, on_progress=seen.append
    )
    assert result == {"counted": 5}
    # Created as a task (tools/call with params.task: no idempotency key), followed by its FastMCP task id.
    entry = journal.get("count")
    assert entry is not None and entry.created_via == "call" and entry.state == "completed"
    assert entry.handle is not None and FASTMCP_TASK_ID.match(entry.handle)
    assert {p.handle for p in seen} == {entry.handle} and seen[-1].status == "completed"
    assert await task_status(older_only.url, entry.handle) == "completed"
    # Answered from the journal the second time: nothing created twice.
    assert await follow(connect(older_only.url), "count_to", {"n": 5}, key="count", journal=journal) == result

    with pytest.raises(JobToolError, match="not today"):
        await follow(connect(older_only.url), "refuse", {"reason": "not today"})


async def test_follow_cancels_an_abandoned_task_with_tasks_cancel(older_only: ServerProcess) -> None:
    with pytest.raises(DeadlineExceeded) as raised:
        await follow(
            connect(older_only.url), "sleep_for", {"seconds": 60}, deadline=1.5, cancel_on_abandon=True
        )
    assert raised.value.cancelled and raised.value.handle is not None
    assert await task_status(older_only.url, raised.value.handle) == "cancelled"


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpExampleServer]:
    with example_process(
        tmp_path_factory.mktemp("example-older-follow"), {OWNER: "owner", OTHER: "other"}
    ) as server:
        yield server


async def test_on_the_example_server_a_handshake_client_prefers_the_handle_tools(
    example: HttpExampleServer, tmp_path: Path
) -> None:
    handshake = connect(example.url, token=OWNER, mode="legacy")
    manifest = await read_manifest(handshake)
    assert manifest.tasks_designs == ("2025-11-25",) and "deploy_release" in manifest.older_task_tools
    journal = Journal(tmp_path / "follows.db")
    answer = {"approve": True, "environment": "staging"}
    result = await follow(
        handshake,
        "deploy_release",
        {"version": "8.0.0"},
        key="auto",
        journal=journal,
        on_input=lambda *_: answer,
    )
    assert result["environment"] == "staging"
    auto = journal.get("auto")
    assert auto is not None and auto.created_via == "start"  # `<job>_start`, with its idempotency key


async def test_on_the_example_server_prefer_tasks_follows_the_2025_11_25_design_and_answers_its_question(
    example: HttpExampleServer, tmp_path: Path
) -> None:
    journal = Journal(tmp_path / "follows.db")
    asked: list[tuple[str, str]] = []

    def approve(key: str, message: str, schema: dict[str, object]) -> dict[str, object]:
        asked.append((key, message))
        return {"approve": True, "environment": "production"}

    handshake = connect(example.url, token=OWNER, mode="legacy")
    result = await follow(
        handshake,
        "deploy_release",
        {"version": "9.0.0"},
        key="older",
        journal=journal,
        on_input=approve,
        prefer="tasks",
    )
    assert result["environment"] == "production" and result["version"] == "9.0.0"
    [(_, message)] = asked  # asked on the tasks/result stream, answered through the callback
    assert message.startswith("Release 9.0.0 is built")
    entry = journal.get("older")
    assert entry is not None and entry.created_via == "call" and entry.handle is not None
    # One job, every face: the task's id is the job's handle.
    async with httpx2.AsyncClient(timeout=30) as http:
        progress = await Wire(example.url, http).tool(
            "deploy_release_progress", {"handle": entry.handle}, token=OWNER
        )
    assert progress.result["structuredContent"]["status"] == "completed"


async def test_without_an_answer_callback_the_question_on_the_tasks_result_stream_is_raised(
    example: HttpExampleServer,
) -> None:
    handshake = connect(example.url, token=OWNER, mode="legacy")
    with pytest.raises(InputRequiredError) as raised:
        await follow(handshake, "deploy_release", {"version": "9.1.0"}, prefer="tasks", deadline=60)
    [question] = raised.value.questions
    assert question.message.startswith("Release 9.1.0 is built")
    assert question.requested_schema["required"] == ["approve", "environment"]
    async with httpx2.AsyncClient(timeout=30) as http:  # the job still waits for its answer
        progress = await Wire(example.url, http).tool(
            "deploy_release_progress", {"handle": raised.value.handle}, token=OWNER
        )
    assert progress.result["structuredContent"]["status"] == "input_required"
