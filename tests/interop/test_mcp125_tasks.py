"""The official Python SDK 1.25 (`mcp==1.25.0`) follows the example's jobs through the 2025-11-25 experimental
Tasks design, over Streamable HTTP on the SDK's `MCPServer` and on FastMCP 4, with two bearer tokens.

The client pins its own `mcp`, so it runs in a virtual environment of its own (tests/interop/.venv-mcp125,
created once and then reused) as a subprocess (tests/interop/mcp125_client.py); this side starts the server,
asserts on what the client saw, and reads the same jobs through the handle tools and the 2026-07-28 face.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from bench.peer import ensure_venv
from tests.support import FRAMEWORKS, HttpExampleServer
from tests.tasks.wire import Wire, example_process

pytestmark = pytest.mark.timeout(420)  # a first run creates the client's virtual environment

VENV = Path(__file__).with_name(".venv-mcp125")
CLIENT = Path(__file__).with_name("mcp125_client.py")
OWNER, OTHER = "mcp125-owner-token-5d2c", "mcp125-other-token-9b7e"
UNKNOWN_TASK = "Unknown task: no task with this taskId is available to you."


@pytest.fixture(scope="module")
def older_python() -> str:
    problem = ensure_venv(VENV, ["mcp==1.25.0"], "import mcp.client.experimental.tasks", timeout=300)
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"mcp 1.25 interop: {problem}")
        pytest.skip(f"mcp 1.25 interop: {problem}")
    return str(VENV / "bin" / "python")


@pytest.fixture(scope="module", params=FRAMEWORKS)
def example(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[HttpExampleServer]:
    tokens = {OWNER: "older-owner", OTHER: "older-other"}
    with example_process(tmp_path_factory.mktemp("example-mcp125"), tokens, request.param) as process:
        yield process


def run_client(python: str, url: str) -> dict[str, Any]:
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        [python, str(CLIENT), url, OWNER, OTHER], capture_output=True, text=True, timeout=180, env=env
    )
    assert done.returncode == 0, f"the mcp 1.25 client failed:\n{done.stderr[-4000:]}"
    seen: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return seen


async def test_mcp_1_25_creates_follows_cancels_and_lists_its_own_tasks(
    older_python: str, example: HttpExampleServer
) -> None:
    seen = run_client(older_python, example.url)
    assert seen["protocol"] == "2025-11-25"
    assert seen["capabilities"]["tasks"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    execution = seen["execution"]
    assert execution["generate_report"] == execution["export_dataset"] == "optional"
    assert execution["lookup_account"] is None and execution["generate_report_progress"] is None

    task = seen["created"]["task"]
    assert task["status"] == "working" and task["pollInterval"] == 2000
    assert task["ttl"] == 6 * 3600 * 1000 and task["createdAt"].endswith("Z")
    assert seen["got"]["taskId"] == task["taskId"] and seen["got"]["status"] in ("working", "completed")
    report = seen["result"]
    assert report["structuredContent"]["account"] == "acme" and report["structuredContent"]["months"] == 2
    assert report["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task["taskId"]}
    assert seen["ended"] == "completed"

    assert seen["cancelled"]["status"] == "cancelled" and seen["cancelled"]["taskId"] == seen["export_id"]
    assert seen["cancel_again"]["error"]["code"] == -32602
    assert seen["cancelled_result"]["isError"] is True
    assert seen["deployed"]["environment"] == "staging"
    assert seen["listed"][1:] == [seen["export_id"], task["taskId"]]  # newest first
    assert seen["plain"]["account"] == "acme"

    other = seen["other"]
    for probe in ("foreign", "made_up"):
        for method in ("get", "result", "cancel"):
            assert other[probe][method]["error"] == {
                "code": -32602,
                "message": other["made_up"][method]["error"]["message"],
            }
            assert other[probe][method]["error"]["message"].startswith(UNKNOWN_TASK)
    assert other["listed"] == []

    # The same job, read through the 2026-07-28 Tasks extension and the handle tools: one id, one status.
    async with httpx2.AsyncClient(timeout=30) as http:
        wire = Wire(example.url, http)
        modern = (await wire.get(task["taskId"], token=OWNER)).result
        progress = await wire.tool("generate_report_progress", {"handle": task["taskId"]}, token=OWNER)
    assert modern["taskId"] == task["taskId"] and modern["status"] == "completed"
    assert progress.result["structuredContent"]["status"] == "completed"
