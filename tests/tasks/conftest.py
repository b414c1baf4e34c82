"""Fixtures of the Tasks adapter tests: the Tasks test server in-process, over HTTP with two bearer tokens,
and raw JSON-RPC access to it."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer

from example_server.__main__ import FileTokenVerifier
from handles import Handles, streamable_http_app
from tests.support import free_port
from tests.tasks.app import build_test_server, create_test_jobs, tasks_config
from tests.tasks.wire import ThreadedServer, Wire

ALICE = "token-alice-tasks-1f9c"
BOB = "token-bob-tasks-8d2e"
TOKENS = {ALICE: "alice", BOB: "bob"}


@pytest.fixture(scope="session")
def tasks_key() -> str:
    return secrets.token_urlsafe(48)


@pytest.fixture
async def local_jobs(tmp_path: Path, tasks_key: str) -> AsyncIterator[Handles]:
    """The test jobs on a fresh SQLite file, runtime started; no authentication (one local principal)."""
    jobs = create_test_jobs(tasks_config(tmp_path / "data", tasks_key))
    async with jobs.running():
        yield jobs


@pytest.fixture
def local_server(local_jobs: Handles) -> MCPServer[Any]:
    return build_test_server(local_jobs)


@pytest.fixture(scope="session")
def http_server(tmp_path_factory: pytest.TempPathFactory, tasks_key: str) -> Iterator[ThreadedServer]:
    """The test server over Streamable HTTP (stateless), requiring one of `TOKENS` as a bearer token."""
    jobs = create_test_jobs(tasks_config(tmp_path_factory.mktemp("tasks-http"), tasks_key))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = build_test_server(
        jobs,
        token_verifier=FileTokenVerifier(TOKENS),
        auth=AuthSettings(issuer_url=base, resource_server_url=f"{base}/mcp", validate_token_resource=False),  # type: ignore[arg-type]
    )
    threaded = ThreadedServer(streamable_http_app(server, jobs), port).start()
    try:
        yield threaded
    finally:
        threaded.stop()


@pytest.fixture
async def wire(http_server: ThreadedServer) -> AsyncIterator[Wire]:
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=60)) as http:
        yield Wire(http_server.url, http)
