"""The operator's switches against the example server over Streamable HTTP, set with the real `handles`
command while the server runs, and seen through the official `mcp` client.

- the Tasks kill switch: a declaring `tools/call` gets the inline result or the job's handle instead of
  a task, while `tasks/get`, `tasks/update` and `tasks/cancel` keep serving the tasks already created;
- a paused job kind: every face refuses its starts with the retryable `paused` error and its `next`,
  while a job of that kind already running goes on to its result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp_types import CallToolResult

from handles.client.tasks import CreateTaskResult, TasksClientExtension, cancel_task
from tests.support import HttpExampleServer, ToolClient, approve_deploy_task, result_body, wait_task

pytestmark = pytest.mark.timeout(120)

CACHE_SECONDS = 0.5
"""`HANDLES_SWITCH_CACHE_SECONDS` of the server: a switch must act on the first call this long after it is set."""
HANDLES = Path(sys.executable).parent / "handles"


@contextmanager
def example_server(data_dir: Path, key: str, job_seconds: float) -> Iterator[HttpExampleServer]:
    env = {"HANDLES_SWITCH_CACHE_SECONDS": str(CACHE_SECONDS), "EXAMPLE_JOB_SECONDS": str(job_seconds)}
    running = HttpExampleServer(data_dir, [key], env=env).start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def server(tmp_path: Path, signing_key: str) -> Iterator[HttpExampleServer]:
    with example_server(tmp_path / "data", signing_key, 1.0) as running:
        yield running


@pytest.fixture
def slow_server(tmp_path: Path, signing_key: str) -> Iterator[HttpExampleServer]:
    """Jobs of 8 s: one started before a switch is still running when the switch acts."""
    with example_server(tmp_path / "data", signing_key, 8.0) as running:
        yield running


def operator(server: HttpExampleServer, *args: str) -> str:
    """Run `handles ARGS` on the server's database, as an operator would; returns its standard output."""
    env = dict(os.environ, HANDLES_DATA_DIR=str(server.data_dir), HANDLES_SECRET_KEYS=server.keys[0])
    env.pop("HANDLES_DATABASE_URL", None)
    done = subprocess.run([str(HANDLES), *args], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def switch(server: HttpExampleServer, *args: str) -> None:
    """Set a switch, then wait out the server's cache bound: from here on every call must obey it."""
    operator(server, *args)
    time.sleep(CACHE_SECONDS + 0.1)


async def declaring_call(client: Client, tool: str, arguments: dict[str, Any]) -> Any:
    """`tools/call` declaring the Tasks extension, the answer unresolved: a `CreateTaskResult` or a result."""
    return await client.session.call_tool(tool, arguments, allow_claimed=True)


async def test_kill_switch_stops_new_tasks_and_keeps_serving_existing_ones(server: HttpExampleServer) -> None:
    async with Client(server.url, extensions=[TasksClientExtension()]) as client:
        # Before: a declaring call becomes a task (and the node has read the switches: its copy is warm).
        deploy = await declaring_call(client, "deploy_release", {"version": "1.0"})
        export = await declaring_call(client, "export_dataset", {"rows": 1000})
        assert isinstance(deploy, CreateTaskResult) and isinstance(export, CreateTaskResult)

        switch(server, "tasks", "off", "--by", "alice", "--reason", "rolling back 1.4")

        # A quick job answers inline, exactly as a call that does not declare the extension.
        report = await declaring_call(client, "generate_report", {"account": "acme", "months": 2})
        assert isinstance(report, CallToolResult) and not report.is_error
        assert report.structured_content is not None and report.structured_content["months"] == 2
        # A job that asks a question answers its handle, for the handle tools.
        handed = await declaring_call(client, "deploy_release", {"version": "2.0"})
        assert isinstance(handed, CallToolResult) and not handed.is_error
        handoff = result_body(handed)
        assert handoff["status"] == "input_required" and "deploy_release_respond" in handoff["next"]
        tools = ToolClient(client)
        answered = await tools.call(
            "deploy_release_respond",
            {"handle": handoff["handle"], "responses": {"q1": {"approve": True, "environment": "staging"}}},
        )
        assert answered["accepted"] == ["q1"]

        # The tasks created before the switch are served in full: read, answered, cancelled.
        await approve_deploy_task(client, deploy.task_id, "production")
        await cancel_task(client.session, export.task_id)
        assert (await wait_task(client, export.task_id, "cancelled", "completed")).status in (
            "cancelled",
            "completed",
        )

        # Visible to operators, with who and when.
        listed = json.loads(operator(server, "switches", "--json"))
        assert [(s["switch"], s["engaged"], s["changed_by"], s["reason"]) for s in listed] == [
            ("tasks", True, "alice", "rolling back 1.4")
        ]
        assert "Switch on: Tasks face: no new tasks, kill switch on by alice at " in operator(
            server, "jobs", "list"
        )

        switch(server, "tasks", "on", "--by", "bob")
        again = await declaring_call(client, "generate_report", {"account": "acme", "months": 1})
        assert isinstance(again, CreateTaskResult)
        listed = json.loads(operator(server, "switches", "--json"))
        assert [(s["engaged"], s["changed_by"]) for s in listed] == [(False, "bob")]
        assert "Switch on" not in operator(server, "jobs", "list")
    assert "operator switch tasks engaged by alice" in server.log()


async def test_paused_job_kind_refuses_new_starts_on_every_face_and_lets_running_jobs_finish(
    slow_server: HttpExampleServer,
) -> None:
    server = slow_server
    async with (
        Client(server.url) as plain_client,
        Client(server.url, extensions=[TasksClientExtension()]) as tasks_client,
    ):
        tools = ToolClient(plain_client)
        running = await tools.call("export_dataset_start", {"rows": 1000})
        assert not running.is_error

        switch(server, "jobs", "pause", "export_dataset", "--retry-after", "30s", "--by", "carol")

        refusals = [
            result_body((await tools.call("export_dataset_start", {"rows": 10})).result),
            result_body((await tools.call("export_dataset", {"rows": 10})).result),
        ]
        through_tasks = await declaring_call(tasks_client, "export_dataset", {"rows": 10})
        assert isinstance(through_tasks, CallToolResult) and through_tasks.is_error
        refusals.append(result_body(through_tasks))
        for refusal in refusals:
            assert refusal["error"] == "paused" and refusal["retryable"] is True, refusal
            assert refusal["retry_after_seconds"] == 30
            assert "temporary" in refusal["next"] and "in about 30 s" in refusal["next"]
            assert "nothing was started" in refusal["message"]
        # Other job kinds are not paused; the export that was running goes on to its result.
        report = await tools.call("generate_report_start", {"account": "acme", "months": 1})
        assert not report.is_error
        still = await tools.call("export_dataset_progress", {"handle": running["handle"]})
        assert still["status"] == "working", "the job started before the pause is still running"
        fetched = await tools.call("export_dataset_fetch", {"handle": running["handle"], "wait_seconds": 30})
        assert fetched["status"] == "completed" and fetched["result"]["summary"].startswith("1000 rows")
        assert "export_dataset: new starts paused by carol at " in operator(server, "jobs", "list")

        switch(server, "jobs", "unpause", "export_dataset", "--by", "carol")
        assert not (await tools.call("export_dataset_start", {"rows": 10})).is_error
    stored = json.loads(operator(server, "jobs", "list", "--job", "export_dataset", "--json"))
    assert len(stored) == 2, "a refused start stores nothing"
