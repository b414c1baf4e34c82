"""The example server as shipped (`python -m example_server --http --tokens FILE`, on `MCPServer` and
with `--fastmcp` on FastMCP 4) serves all three kinds of client: one declaring the Tasks extension, a 2026 client without it, and a 2025-era handshake client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp_types import ElicitRequestParams, ElicitResult

from handles.client.tasks import TasksClientExtension
from tests.harness.client import mcp_over_http
from tests.support import HttpExampleServer
from tests.tasks.wire import TASKS, Wire, example_on_each_framework

pytestmark = pytest.mark.timeout(120)

TOKENS = {"example-alice-token-51b2": "alice", "example-bob-token-0c7d": "bob"}
ALICE, BOB = list(TOKENS)


example = example_on_each_framework("example-tasks", TOKENS)


@asynccontextmanager
async def connect(url: str, token: str, **options: Any) -> AsyncIterator[Client]:
    async with mcp_over_http(url, token, timeout=60, **options) as client:
        yield client


async def approve(_context: ClientRequestContext, _params: ElicitRequestParams) -> ElicitResult:
    return ElicitResult(action="accept", content={"approve": True, "environment": "staging"})


async def test_the_example_server_advertises_tasks_and_refuses_foreign_task_ids(
    example: HttpExampleServer,
) -> None:
    async with httpx2.AsyncClient(timeout=30) as http:
        wire = Wire(example.url, http)
        discovered = await wire.call("server/discover", {}, token=ALICE, declare=False)
        assert discovered.result["capabilities"]["extensions"][TASKS] == {}
        created = await wire.tool("export_dataset", {"rows": 1000}, token=ALICE)
        task_id = created.result["taskId"]
        foreign = await wire.get(task_id, token=BOB)
        assert foreign.status == 400 and foreign.error["code"] == -32602
        assert (await wire.call("tasks/cancel", {"taskId": task_id}, token=ALICE)).status == 200


async def test_a_tasks_client_gets_results_and_answers_questions(example: HttpExampleServer) -> None:
    async with connect(
        example.url, ALICE, extensions=[TasksClientExtension()], elicitation_callback=approve
    ) as client:
        report = await client.call_tool("generate_report", {"account": "acme", "months": 2})
        assert report.structured_content is not None and report.structured_content["months"] == 2
        deployed = await client.call_tool("deploy_release", {"version": "9.9.9"})
        assert deployed.structured_content is not None
        assert deployed.structured_content["environment"] == "staging"


@pytest.mark.parametrize(("mode", "version"), [("legacy", "2025-11-25"), ("2026-07-28", "2026-07-28")])
async def test_clients_without_the_extension_get_plain_results(
    example: HttpExampleServer, mode: str, version: str
) -> None:
    """The official SDK client in handshake mode (2025-11-25) and in 2026-07-28 mode, not declaring Tasks."""
    async with connect(example.url, ALICE, mode=mode) as client:
        assert client.protocol_version == version
        report = await client.call_tool("generate_report", {"account": "acme", "months": 2})
        assert report.structured_content is not None and report.structured_content["account"] == "acme"
        asked = await client.call_tool("deploy_release", {"version": "1.0.0"})
        assert asked.structured_content is not None
        assert asked.structured_content["status"] == "input_required"
        assert "q1" in asked.structured_content["input_requests"]
        assert "deploy_release_respond" in asked.structured_content["next"]
        await client.call_tool("deploy_release_cancel", {"handle": asked.structured_content["handle"]})
