"""An HTTP node whose PostgreSQL accepts connections but never answers: every face waits for it off the
event loop, so the node stays responsive, and each call gets the retryable store error.

The database is a socket in this test that accepts and stays silent, so each connection attempt lasts the
URL's `connect_timeout`; the node is the example server as a subprocess over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.durability.harness import example_node
from tests.tasks.wire import Reply, Wire

CONNECT_TIMEOUT = 3
"""Seconds each connection attempt to the silent database lasts (the smallest psycopg takes is 2)."""


class SilentDatabase:
    """A TCP port that accepts every connection and never sends a byte."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.port = self._socket.getsockname()[1]
        self._accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name="silent-database", daemon=True)
        self._thread.start()

    def url(self) -> str:
        return (
            f"postgresql+psycopg://handles:pw@127.0.0.1:{self.port}/handles?connect_timeout={CONNECT_TIMEOUT}"
        )

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:
                return  # closed
            self._accepted.append(connection)

    def close(self) -> None:
        self._socket.close()
        for connection in self._accepted:
            connection.close()


@pytest.fixture
def silent_database() -> Iterator[SilentDatabase]:
    database = SilentDatabase()
    try:
        yield database
    finally:
        database.close()


async def _slowest_probe(base: str, request: Awaitable[Reply]) -> tuple[Reply, float]:
    """`request`'s reply, and the longest `/healthz` took to answer while it was in flight."""
    call = asyncio.ensure_future(request)
    slowest = 0.0
    async with httpx2.AsyncClient(timeout=30) as http:
        while not call.done():
            began = time.monotonic()
            response = await http.get(base + "/healthz")
            slowest = max(slowest, time.monotonic() - began)
            assert response.status_code == 200
            await asyncio.sleep(0.1)
    return await call, slowest


def _declaring_call(wire: Wire) -> Awaitable[Reply]:
    """A `tools/call` of a job's plain tool that declares the Tasks extension (it would make a task)."""
    return wire.tool("generate_report", {"account": "acme", "months": 2})


def _calls(wire: Wire) -> list[tuple[str, Callable[[], Awaitable[Reply]]]]:
    return [
        ("tools/call", lambda: _declaring_call(wire)),
        ("tasks/get", lambda: wire.get("not-a-task-id")),
        ("subscriptions/listen", lambda: wire.listen({"taskIds": ["not-a-task-id"]}, seconds=30)),
    ]


def test_a_silent_database_never_blocks_the_node_and_every_call_gets_the_retryable_store_error(
    tmp_path: Path, silent_database: SilentDatabase
) -> None:
    server = example_node(tmp_path, HANDLES_DATABASE_URL=silent_database.url())
    server.start_timeout = 6 * CONNECT_TIMEOUT + 20  # the start tries the database twice before listening
    server.start()
    base = server.url.removesuffix("/mcp")

    async def main() -> tuple[dict[str, tuple[Reply, float]], list[Reply], float]:
        async with httpx2.AsyncClient(timeout=60) as http:
            wire = Wire(server.url, http)
            replies = {name: await _slowest_probe(base, call()) for name, call in _calls(wire)}
            began = time.monotonic()
            together = await asyncio.gather(*(_declaring_call(wire) for _ in range(4)))
            return replies, list(together), time.monotonic() - began

    try:
        replies, together, took = asyncio.run(main())
    finally:
        server.stop()
    for name, (_, slowest) in replies.items():
        assert slowest < 1.0, f"/healthz took {slowest:.1f}s to answer during a declaring {name}"
    called, _ = replies["tools/call"]
    assert called.result.get("isError") is True, called.body
    refused: dict[str, Any] = json.loads(called.result["content"][0]["text"])
    assert refused["error"] == "store_unavailable" and refused["retryable"] is True, refused
    for name in ("tasks/get", "subscriptions/listen"):
        got, _ = replies[name]
        assert got.error["code"] == -32603, (name, got.body)
        assert "unavailable" in got.error["message"] and "Retry" in got.error["message"], (name, got.body)
    # Calls arriving together share one attempt to reach the database: none queues behind another's.
    assert took < 2 * CONNECT_TIMEOUT + 2, f"four calls together took {took:.1f}s"
    assert all(reply.result.get("isError") is True for reply in together), [r.body for r in together]
    assert "Traceback" not in server.log()
