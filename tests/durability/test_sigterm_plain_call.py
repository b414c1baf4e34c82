"""SIGTERM of a node while a plain call waits for its job inline: the call, the probes and a second signal
are all answered at once, because waiting on a draining node awaits instead of spinning on reads (on an
SQLite file, reads that run on the event loop and never yield; on PostgreSQL, a tight read loop)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client

from tests.harness.postgres import fresh_schema

from .harness import example_node


def _probe(base: str, path: str) -> tuple[int, dict[str, Any]] | None:
    """`GET base+path`: its status and body, or None when the node does not answer within 2 s."""
    try:
        response = httpx2.get(base + path, timeout=2)
    except httpx2.TimeoutException:
        return None
    return response.status_code, response.json()


@pytest.mark.parametrize(
    ("framework", "database"), [("mcpserver", "sqlite"), ("fastmcp", "sqlite"), ("mcpserver", "postgresql")]
)
def test_a_plain_call_in_flight_at_sigterm_gets_its_handle_and_the_node_stays_responsive(
    tmp_path: Path, framework: str, database: str, request: pytest.FixtureRequest
) -> None:
    if database == "sqlite":
        _signalled_mid_call(tmp_path, framework)
        return
    with fresh_schema(request.getfixturevalue("postgres_url").split("?")[0], "handles_drain") as url:
        _signalled_mid_call(tmp_path, framework, HANDLES_DATABASE_URL=url, HANDLES_AUTO_MIGRATE="1")


def _signalled_mid_call(tmp_path: Path, framework: str, **env: str) -> None:
    server = example_node(
        tmp_path,
        framework,
        EXAMPLE_JOB_SECONDS="60",
        HANDLES_LEASE_SECONDS="30",
        HANDLES_DRAIN_SECONDS="25",
        HANDLES_INLINE_BUDGET_SECONDS="30",
        **env,
    )
    base = server.url.removesuffix("/mcp")
    server.start()

    async def main() -> tuple[dict[str, Any], float, tuple[int, dict[str, Any]] | None]:
        async with Client(server.url) as client:
            call = asyncio.create_task(client.call_tool("generate_report", {"account": "acme", "months": 6}))
            await asyncio.sleep(1.0)
            assert not call.done(), "the plain call waits inline for its 60 s job"
            began = time.monotonic()
            server.process.terminate()
            result = await asyncio.wait_for(call, 10)
            took = time.monotonic() - began
            ready = await asyncio.to_thread(_probe, base, "/readyz")
        assert result.structured_content is not None, result
        return result.structured_content, took, ready

    try:
        body, took, ready = asyncio.run(main())
        assert took < 2, f"the plain call was answered {took:.1f}s after the signal"
        assert body["status"] == "working" and body["handle"], body
        assert "shutting down" in body["next"], body["next"]
        assert ready == (503, {"status": "not_ready", "reason": "shutting down (draining)"}), ready
        assert server.process.poll() is None, "the first signal drains: the job still runs"
        began = time.monotonic()
        server.process.terminate()
        code = server.process.wait(timeout=15)
        stopped = time.monotonic() - began
    finally:
        server.stop()
    assert code in (0, -15), server.log()[-3000:]
    assert stopped < 3, f"{stopped:.1f}s to stop after the second signal"
