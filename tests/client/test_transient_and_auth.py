"""Transient failures are retried with backoff and never cancel the job; HTTP 401/403 is an authentication
error at once, in both clients (`handles.client.follow` and `handles.client.tasks.follow_task`).

Against real servers: the Tasks test server in-process with a `tasks/get` that fails on demand, and the
same server over Streamable HTTP behind a bearer-token verifier that requires a scope."""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR

from handles import Handles, streamable_http_app
from handles.client import AuthenticationRefusedError, Journal, connect, follow, http_client
from handles.client.tasks import AuthenticationError, CreateTaskResult, TasksClientExtension, follow_task
from handles.server.tasks_extension import TasksExtension
from tests.support import free_port
from tests.tasks.app import build_test_server, create_test_jobs, tasks_config
from tests.tasks.wire import ThreadedServer

pytestmark = pytest.mark.timeout(60)


# -- a tasks/get that fails on demand ---------------------------------------------------------------


@dataclass
class Flaky:
    jobs: Handles
    server: MCPServer[Any]
    failures_left: int = 0
    gets: int = 0

    def status_of(self, kind: str) -> str:
        (job,) = self.jobs.service.store.repo.list_jobs(kind=kind, limit=10)
        return str(job.status)


@pytest.fixture
async def flaky(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Flaky]:
    original = TasksExtension.get_task
    state: Flaky

    async def get_task(self: Any, ctx: Any, params: Any) -> Any:
        state.gets += 1
        if state.failures_left > 0:
            state.failures_left -= 1
            raise MCPError(code=INTERNAL_ERROR, message="The store blinked; try again.")
        return await original(self, ctx, params)

    monkeypatch.setattr(TasksExtension, "get_task", get_task)  # before the server binds its methods
    jobs = create_test_jobs(tasks_config(tmp_path / "data", secrets.token_urlsafe(48)))
    async with jobs.running():
        state = Flaky(jobs, build_test_server(jobs))
        yield state


async def test_the_tasks_client_retries_a_transient_tasks_get_failure_without_cancelling(
    flaky: Flaky,
) -> None:
    # push=False: it is the tasks/get polls that fail here
    async with Client(
        flaky.server, extensions=[TasksClientExtension(default_poll_seconds=0.05, push=False)]
    ) as client:
        flaky.failures_left = 1
        result = await client.call_tool("slow", {"seconds": 0.5})
    assert result.structured_content is not None and not result.is_error
    assert flaky.failures_left == 0 and flaky.gets >= 2
    assert flaky.status_of("slow") == "completed"


async def test_the_tasks_client_gives_up_after_its_retries_and_leaves_the_task_running(flaky: Flaky) -> None:
    async with Client(flaky.server, extensions=[TasksClientExtension()]) as client:
        created = await client.session.call_tool("slow", {"seconds": 1.5}, allow_claimed=True)
        assert isinstance(created, CreateTaskResult)
        flaky.failures_left = 100
        with pytest.raises(MCPError) as failed:
            await follow_task(client.session, created, retries=1)
        assert failed.value.error.code == INTERNAL_ERROR
        assert flaky.gets == 2  # one try, one retry
        assert flaky.status_of("slow") == "working"  # not cancelled: the caller did not give up
        flaky.failures_left = 0
        result = await follow_task(client.session, created.task_id)
    assert not result.is_error
    assert flaky.status_of("slow") == "completed"


async def test_follow_retries_a_transient_tasks_get_failure_and_keeps_the_job(
    flaky: Flaky, tmp_path: Path
) -> None:
    async with Client(flaky.server, extensions=[TasksClientExtension(push=False)]) as client:
        flaky.failures_left = 2
        result = await follow(
            client,
            "slow",
            {"seconds": 0.5},
            prefer="tasks",
            cancel_on_abandon=True,
            journal=Journal(tmp_path / "journal.db"),
        )
    assert result == {"steps": 10}
    assert flaky.failures_left == 0
    assert flaky.status_of("slow") == "completed"


# -- 401 and 403 -----------------------------------------------------------------------------------

FULL, NARROW = "token-full-6a1f", "token-narrow-90bd"


class ScopedTokens:
    """`FULL` may use the server (scope `jobs`); `NARROW` is valid but lacks the scope; others are unknown."""

    async def verify_token(self, token: str) -> AccessToken | None:
        scopes = {FULL: ["jobs"], NARROW: []}.get(token)
        if scopes is None:
            return None
        return AccessToken(token=token, client_id="carol", subject="carol", scopes=scopes)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedServer]:
    jobs = create_test_jobs(tasks_config(tmp_path_factory.mktemp("guarded"), secrets.token_urlsafe(48)))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    auth = AuthSettings(
        issuer_url=base,  # type: ignore[arg-type]
        resource_server_url=f"{base}/mcp",  # type: ignore[arg-type]
        required_scopes=["jobs"],
        validate_token_resource=False,
    )
    server = build_test_server(jobs, token_verifier=ScopedTokens(), auth=auth)
    threaded = ThreadedServer(streamable_http_app(server, jobs), port).start()
    try:
        yield threaded
    finally:
        threaded.stop()


@asynccontextmanager
async def pinned_client(url: str, token: str) -> AsyncIterator[Client]:
    """A 2026-07-28 client that sends nothing until asked (no server/discover), with `token`."""
    async with (
        http_client(token=token) as http,
        Client(
            streamable_http_client(url, http_client=http),
            mode="2026-07-28",
            extensions=[TasksClientExtension()],
        ) as client,
    ):
        yield client


async def test_follow_with_a_valid_token_works_through_connect(guarded: ThreadedServer) -> None:
    assert await follow(connect(guarded.url, token=FULL), "quick", {"text": "ok"}) == {
        "text": "ok",
        "length": 2,
    }


@pytest.mark.parametrize(("token", "status"), [("token-unknown", 401), (NARROW, 403)])
async def test_follow_raises_an_authentication_error_at_once_for_401_and_403(
    guarded: ThreadedServer, token: str, status: int
) -> None:
    began = time.monotonic()
    with pytest.raises(AuthenticationRefusedError) as refused:
        await follow(connect(guarded.url, token=token), "quick", {"text": "no"}, retries=3)
    assert time.monotonic() - began < 3, "an authentication error is not retried"
    assert refused.value.status == status
    assert isinstance(refused.value, AuthenticationError)
    assert f"HTTP {status}" in str(refused.value)
    assert "Could not reach" not in str(refused.value)


@pytest.mark.parametrize(("token", "status"), [("token-unknown", 401), (NARROW, 403)])
async def test_the_tasks_client_raises_an_authentication_error_for_401_and_403(
    guarded: ThreadedServer, token: str, status: int
) -> None:
    async with pinned_client(guarded.url, FULL) as owner:
        created = await owner.session.call_tool("slow", {"seconds": 2}, allow_claimed=True)
        assert isinstance(created, CreateTaskResult)
        async with pinned_client(guarded.url, token) as other:
            began = time.monotonic()
            with pytest.raises(AuthenticationError) as refused:
                await follow_task(other.session, created, retries=3)
            assert time.monotonic() - began < 3
        assert refused.value.status == status and f"HTTP {status}" in str(refused.value)
        # The owner still sees the task going on: a refused follower does not cancel it.
        result = await follow_task(owner.session, created.task_id)
    assert not result.is_error
