"""FastMCP 4.1.4, with `fastmcp-tasks` 4.1.4 and without it, drives the example server over Streamable HTTP,
served by the SDK's `MCPServer` and by FastMCP 4 (`--fastmcp`).

`fastmcp-tasks` pins its own FastMCP and `mcp`, so the client runs in its own virtual environment
(bench/.peer-venv, created once by `bench.peer.ensure_peer_venv` and then reused) as a subprocess
(tests/interop/fastmcp_client.py); this side starts the server and asserts on what the client saw.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from handles.config import HandlesConfig
from tests.harness.process import ServerProcess, free_port, python_module
from tests.support import FRAMEWORKS, HttpExampleServer, example_env, new_key, stdio_params
from tests.tasks.wire import example_process

pytestmark = pytest.mark.timeout(420)  # the first run creates the client's virtual environment (~40 s)

CLIENT = Path(__file__).with_name("fastmcp_client.py")
TOKEN = "fastmcp-interop-token-3e1a"
SWITCH_CACHE_SECONDS = HandlesConfig.switch_cache_seconds
"""The example server's bound (its default): a switch acts on every call sent this long after it was set."""


@pytest.fixture(scope="module", params=FRAMEWORKS)
def example(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[HttpExampleServer]:
    """The example on the SDK's `MCPServer`, then on FastMCP 4 (`--fastmcp`, the project's FastMCP)."""
    with example_process(
        tmp_path_factory.mktemp("example-fastmcp"), {TOKEN: "fastmcp-user"}, request.param
    ) as process:
        yield process


def run_client(python: str, url: str, mode: str) -> dict[str, Any]:
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        [python, str(CLIENT), url, TOKEN, mode], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, f"the FastMCP client failed:\n{done.stderr[-4000:]}"
    seen: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return seen


def test_fastmcp_with_fastmcp_tasks_follows_answers_and_cancels_through_tasks(
    peer_python: str, example: HttpExampleServer
) -> None:
    assert_followed_through_tasks(run_client(peer_python, example.url, "tasks"))


def test_fastmcp_without_the_tasks_extension_uses_plain_and_handle_tools(
    peer_python: str, example: HttpExampleServer
) -> None:
    assert_followed_through_plain_and_handle_tools(run_client(peer_python, example.url, "plain"))


@pytest.mark.parametrize("mode", ["tasks", "plain"])
def test_fastmcp_over_stdio_with_and_without_fastmcp_tasks(
    peer_python: str, tmp_path: Path, mode: str
) -> None:
    """The same two clients, launching the example server (`MCPServer`) over stdio with FastMCP's
    `StdioTransport`: `serve_stdio` writes its replies from the event loop (handles/server/stdio_stdout.py)."""
    params = stdio_params(example_env(tmp_path, [new_key()]))
    server = tmp_path / "server.json"
    server.write_text(
        json.dumps(
            {"command": params.command, "args": params.args, "env": params.env, "cwd": str(params.cwd)}
        )
    )
    seen = run_client(peer_python, f"stdio:{server}", mode)
    if mode == "tasks":
        assert_followed_through_tasks(seen)
    else:
        assert_followed_through_plain_and_handle_tools(seen)


def assert_followed_through_tasks(seen: dict[str, Any]) -> None:
    assert seen["fastmcp_tasks"] == "4.1.4"
    assert seen["report"]["account"] == "acme" and seen["report"]["months"] == 2
    assert len(seen["report"]["revenue_by_month"]) == 2
    assert seen["report_task_id"]  # the call became a task
    assert seen["report_task"]["account"] == "globex"
    assert seen["deploy_asked"] == ["q1"]
    assert seen["questions"] == ["Release 4.1.4 is built and tested. Deploy it, and where?"]
    assert seen["deploy"]["environment"] == "staging"
    assert seen["deploy"]["steps"][-1] == "switch traffic"
    assert seen["export_final"] == "cancelled"
    assert seen["export_progress_status"] == "cancelled"
    assert_export_link(seen["export_link"])


def assert_followed_through_plain_and_handle_tools(seen: dict[str, Any]) -> None:
    assert seen["fastmcp_tasks_imported"] is False
    assert seen["report"]["account"] == "acme" and seen["report"]["months"] == 2
    assert seen["deploy_handoff"] in ("working", "input_required")
    assert seen["deploy"]["environment"] == "production"
    assert seen["export_final"] == "cancelled"
    assert_export_link(seen["export_link"])


def test_fastmcp_with_fastmcp_tasks_gets_plain_answers_while_the_kill_switch_is_on(
    peer_python: str, example: HttpExampleServer
) -> None:
    """The operator's `handles tasks off`: a FastMCP client that declares the extension is answered
    as one that does not (the result inline; a job that asks a question answers its handle)."""

    def tasks(state: str) -> None:
        env = dict(os.environ, HANDLES_DATA_DIR=str(example.data_dir))
        env.pop("HANDLES_DATABASE_URL", None)
        done = subprocess.run(
            [sys.executable, "-m", "handles.cli", "tasks", state, "--by", "interop-test"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert done.returncode == 0, done.stderr
        time.sleep(SWITCH_CACHE_SECONDS + 0.2)  # every call from here on obeys it

    tasks("off")
    try:
        seen = run_client(peer_python, example.url, "tasks-off")
    finally:
        tasks("on")
    assert seen["fastmcp_tasks"] == "4.1.4"
    assert seen["report"]["account"] == "acme" and len(seen["report"]["revenue_by_month"]) == 2
    assert seen["deploy_has_handle"] is True
    assert seen["deploy_handoff"]["job"] == "deploy_release"
    assert seen["deploy_handoff"]["status"] in ("working", "input_required")
    assert "deploy_release_progress" in seen["deploy_handoff"]["next"]


def test_fastmcp_with_fastmcp_tasks_takes_a_quick_jobs_result_in_the_first_response(
    peer_python: str, tmp_path: Path
) -> None:
    """A job with `task_after` (bench.app's `work_inline`, 1 s): FastMCP's `call_tool` takes the result of
    a job that ends that soon and follows the task of one that does not. fastmcp-tasks' explicit
    `call_tool_task` refuses a result where it expects a task (the extension lets the server answer either
    way; docs/tasks.md says so)."""
    port = free_port()
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({TOKEN: "fastmcp-user"}))
    settings = dict(os.environ, HANDLES_DATA_DIR=str(tmp_path / "data"), HANDLES_SECRET_KEYS=new_key())
    settings.pop("HANDLES_DATABASE_URL", None)
    server = ServerProcess(
        python_module("bench.app", "--http", "--port", str(port), "--tokens", str(tokens)),
        settings,
        tmp_path / "server.log",
        port,
        ready="http",
        start_timeout=30,
        stop_timeout=10,
    ).start()
    try:
        seen = run_client(peer_python, server.url, "task-after")
    finally:
        server.stop()
    assert seen["fastmcp_tasks"] == "4.1.4"
    assert seen["quick"] == {"slept": 0.0, "mark": ""}
    assert seen["slow"] == {"slept": 1.5, "mark": ""}
    assert seen["slow_task_id"] and seen["slow_task"] == {"slept": 1.5, "mark": ""}
    assert seen["explicit_quick"]["raised"] == "ToolError"
    assert "did not run as a task" in seen["explicit_quick"]["message"]


def assert_export_link(link: dict[str, object]) -> None:
    """A 300-row export read through its resource_link by FastMCP: the whole CSV, as the link said."""
    assert link["mime_type"] == "text/csv" and link["rows"] == 300
    assert link["read_bytes"] == link["size"]
