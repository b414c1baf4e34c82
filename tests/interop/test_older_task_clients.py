"""Real clients of the 2025-11-25 experimental Tasks design follow the example's jobs, over Streamable HTTP on the
SDK's `MCPServer` and on FastMCP 4, with two bearer tokens: the official Python SDK 1.25, FastMCP 3 and the
TypeScript SDK 1.32 (the closest stand-in for VS Code's client).

Each pins its own `mcp` (or is Node.js), so each runs as a subprocess from an environment of its own, created
on the first run and reused afterwards: tests/interop/.venv-mcp125 (tests/interop/mcp125_client.py),
tests/interop/.venv-fastmcp3 (fastmcp3_client.py), tests/interop/.ts-sdk (ts_sdk_client.mjs). This side
starts the server, asserts on what each client saw, and reads the same jobs through the handle tools and the
2026-07-28 face.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from bench.peer import ensure_venv
from tests.interop.inspector import ensure_npm_packages
from tests.support import FRAMEWORKS, HttpExampleServer, example_env, new_key, stdio_params
from tests.tasks.wire import Wire, example_process

pytestmark = pytest.mark.timeout(600)  # a first run creates the clients' environments

HERE = Path(__file__).parent
OWNER, OTHER = "older-owner-token-5d2c", "older-other-token-9b7e"
UNKNOWN_TASK = "Unknown task: no task with this taskId is available to you."
TS_SDK_DIR = HERE / ".ts-sdk"


FASTMCP_3 = ("fastmcp[tasks]==3.4.11", "import docket, fastmcp.client.tasks")
"""FastMCP 3's environment, as its client and its server (with the background tasks it serves) both need it."""
MCP_125 = ("mcp==1.25.0", "import mcp.client.experimental.tasks")
OLDER_CLIENTS = ("mcp125", "fastmcp3", "typescript-sdk")


def python_of(venv: str, requirement: str, probe: str) -> str:
    problem = ensure_venv(HERE / venv, [requirement], probe, timeout=400)
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{requirement}: {problem}")
        pytest.skip(f"{requirement}: {problem}")
    return str(HERE / venv / "bin" / "python")


@pytest.fixture(scope="module", params=FRAMEWORKS)
def example(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[HttpExampleServer]:
    tokens = {OWNER: "older-owner", OTHER: "older-other"}
    with example_process(tmp_path_factory.mktemp("example-older-tasks"), tokens, request.param) as process:
        yield process


def older_client(name: str) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of one of `OLDER_CLIENTS`, its environment prepared first."""
    if name == "typescript-sdk":
        ensure_npm_packages(TS_SDK_DIR, {"@modelcontextprotocol/sdk": "1.32.2"})
        node = shutil.which("node")
        assert node is not None
        return [node, str(HERE / "ts_sdk_client.mjs")], {"TS_SDK_DIR": str(TS_SDK_DIR)}
    if name == "fastmcp3":
        return [python_of(".venv-fastmcp3", *FASTMCP_3), str(HERE / "fastmcp3_client.py")], {}
    return [python_of(".venv-mcp125", *MCP_125), str(HERE / "mcp125_client.py")], {}


def client_env(**env: str) -> dict[str, str]:
    """A client's environment: `env` and a bare PATH and HOME."""
    return env | {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "PYTHONUNBUFFERED": "1"}


def run_client(command: list[str], *args: str, timeout: float = 240, **env: str) -> dict[str, Any]:
    done = subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=timeout, env=client_env(**env)
    )
    assert done.returncode == 0, f"{command[-1]} failed:\n{done.stderr[-4000:]}"
    seen: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return seen


async def assert_one_job_every_face(url: str, task_id: str, status: str) -> None:
    """A report's task read through the 2026-07-28 Tasks extension and the handle tools: one id, one status."""
    async with httpx2.AsyncClient(timeout=30) as http:
        wire = Wire(url, http)
        modern = (await wire.get(task_id, token=OWNER)).result
        progress = await wire.tool("generate_report_progress", {"handle": task_id}, token=OWNER)
    assert modern["taskId"] == task_id and modern["status"] == status
    assert progress.result["structuredContent"]["status"] == status


def assert_unknown(error: dict[str, Any]) -> None:
    assert error["code"] == -32602 and UNKNOWN_TASK in error["message"]


async def test_the_python_sdk_1_25_creates_follows_answers_cancels_and_lists_its_own_tasks(
    example: HttpExampleServer,
) -> None:
    command, env = older_client("mcp125")
    seen = run_client(command, example.url, OWNER, OTHER, **env)
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
    # The second deployment's question reached the elicitation handler on the tasks/result stream,
    # related to its task; the handler's answer (another POST) resumed the job to its result.
    elicited = seen["elicited_id"]
    [asked] = seen["asked"]
    assert asked["message"].startswith("Release 3.0.0 is built")
    assert asked["requestedSchema"]["required"] == ["approve", "environment"]
    assert asked["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": elicited}
    assert seen["elicited"]["structuredContent"]["environment"] == "production"
    statuses = [s["status"] for s in seen["statuses"] if s["taskId"] == elicited]
    assert "input_required" in statuses and statuses[-1] == "completed", seen["statuses"]
    assert seen["listed"][2:] == [seen["export_id"], task["taskId"]]  # newest first
    assert seen["plain"]["account"] == "acme"

    other = seen["other"]
    for probe in ("foreign", "made_up"):
        for method in ("get", "result", "cancel"):
            assert other[probe][method] == other["made_up"][method]
            assert_unknown(other[probe][method]["error"])
    assert other["listed"] == []
    await assert_one_job_every_face(example.url, task["taskId"], "completed")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_python_sdk_1_25_answers_a_question_over_stdio(tmp_path: Path, framework: str) -> None:
    server = stdio_params(example_env(tmp_path, [new_key()]), framework=framework).model_dump(mode="json")
    command = [*older_client("mcp125")[0], "--stdio", json.dumps(server)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    [asked] = seen["asked"]
    assert asked["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": seen["task_id"]}
    assert seen["deployed"]["environment"] == "staging" and seen["deployed"]["version"] == "7.0.0"


async def test_fastmcp_3_follows_cancels_and_lists_tasks(example: HttpExampleServer) -> None:
    command, env = older_client("fastmcp3")
    seen = run_client(command, example.url, OWNER, OTHER, **env)
    assert seen["immediate"] is False
    assert seen["report"]["account"] == "acme" and seen["ended"] == "completed"
    assert seen["cancelled"] == "cancelled"
    assert seen["listed"][:3] == [seen["deploy_id"], seen["export_id"], seen["report_id"]]
    [asked] = seen["asked"]
    assert asked["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": seen["deploy_id"]}
    assert seen["deployed"]["environment"] == "production" and seen["deployed"]["version"] == "6.0.0"
    assert_unknown(seen["foreign"])
    assert seen["other_listed"] == []
    await assert_one_job_every_face(example.url, seen["report_id"], "completed")


async def test_the_typescript_sdk_1_32_streams_a_task_and_steers_others(example: HttpExampleServer) -> None:
    command, env = older_client("typescript-sdk")
    seen = run_client(command, example.url, OWNER, OTHER, **env)
    assert seen["protocol"] == "2025-11-25"
    assert seen["capabilities"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    assert seen["execution"]["generate_report"] == "optional" and seen["execution"]["lookup_account"] is None
    # `callToolStream`, which a task-capable tool's call goes through: created, polled, its result.
    assert seen["streamed"][0] == "taskCreated" and seen["streamed"][-1] == "result", seen["streamed"]
    assert seen["report"]["account"] == "acme" and seen["reportResult"] == seen["report"]
    # A deployment's question reached the elicitation handler; its answer resumed the job to its result.
    assert seen["deployStream"][-1] == "result", seen
    assert seen["deployed"]["environment"] == "production" and seen["deployed"]["version"] == "4.0.0"
    [asked] = seen["asked"]
    assert asked["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": seen["deployId"]}
    assert "input_required" in seen["statuses"] and "completed" in seen["statuses"], seen["statuses"]
    assert seen["got"] == "working" and seen["cancelled"] == "cancelled"
    assert seen["cancelAgain"]["error"]["code"] == -32602
    assert seen["listed"][:3] == [seen["exportId"], seen["deployId"], seen["reportId"]]
    assert_unknown(seen["other"]["get"]["error"])
    assert seen["other"]["get"] == seen["other"]["madeUp"]
    assert seen["other"]["listed"] == []
    await assert_one_job_every_face(example.url, seen["reportId"], "completed")
