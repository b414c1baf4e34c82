"""The official `mcp.Client` over Streamable HTTP with a bearer token, as the tests and benchmarks open it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.harness.waiting import until

DEFAULT_TIMEOUT = httpx2.Timeout(30, read=120)


@asynccontextmanager
async def mcp_over_http(
    url: str,
    token: str | None = None,
    *,
    timeout: httpx2.Timeout | float = DEFAULT_TIMEOUT,
    on_request: Callable[[httpx2.Request], Awaitable[None]] | None = None,
    **options: Any,
) -> AsyncIterator[Client]:
    """A connected `Client` on `url`, sending `Authorization: Bearer <token>` when there is a token;
    `on_request` sees every HTTP request it sends, `options` go to `Client` (extensions, callbacks)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    hooks = {"request": [on_request]} if on_request is not None else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout, event_hooks=hooks) as http,
        Client(streamable_http_client(url, http_client=http), **options) as client,
    ):
        yield client


async def abandon_once(
    call: Callable[[], Awaitable[object]], begun: Callable[[], bool], *, within: float = 30
) -> None:
    """Runs `call` and abandons it, as a caller that goes away does, once `begun()` says the server has
    the job: a fixed delay abandons it too early on a loaded machine, before there is anything to cancel.
    A call that returns before it is abandoned is a failure, and so is `begun()` still false after `within`."""

    async def run() -> None:
        await call()
        raise AssertionError("the call returned before it could be abandoned")

    async with anyio.create_task_group() as group:
        group.start_soon(run)
        await until(begun, "the server has the job", within=within)
        group.cancel_scope.cancel()
