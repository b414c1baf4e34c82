"""What an HTTP node logs, read from the example server's own stderr: little at start, nothing per request,
no error at SIGTERM while streamed answers are open."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client

from handles.store import migrate
from tests.durability.harness import example_node
from tests.harness.process import ServerProcess
from tests.startup.support import wait_for_probe

LEGACY_HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": "2025-06-18",  # a handshake-era client: every answer is a streamed (SSE) response
}


async def _long_polls_across_sigterm(server: ServerProcess, count: int) -> list[dict[str, Any]]:
    """Start a report, open `count` streamed `*_progress` long-polls on it, SIGTERM the server; their answers."""
    async with Client(server.url) as client:
        started = await client.call_tool("generate_report_start", {"account": "acme", "months": 4})
    assert started.structured_content is not None, started
    handle = started.structured_content["handle"]
    async with httpx2.AsyncClient(timeout=30) as http:

        async def poll(ident: int) -> dict[str, Any]:
            request = {
                "jsonrpc": "2.0",
                "id": ident,
                "method": "tools/call",
                "params": {
                    "name": "generate_report_progress",
                    "arguments": {"handle": handle, "wait_seconds": 30},
                },
            }
            response = await http.post(server.url, json=request, headers=LEGACY_HEADERS)
            assert response.status_code == 200, response.text
            data = [
                line.removeprefix("data: ")
                for line in response.text.splitlines()
                if line.startswith("data: ")
            ]
            answer: dict[str, Any] = json.loads(data[-1])
            return answer

        polls = [asyncio.create_task(poll(i)) for i in range(count)]
        await asyncio.sleep(0.5)
        server.process.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(asyncio.gather(*polls), 10)


def test_start_request_and_sigterm_log_only_what_an_operator_needs(tmp_path: Path) -> None:
    server = example_node(tmp_path, EXAMPLE_JOB_SECONDS="3", HANDLES_DRAIN_SECONDS="5")
    server.start()
    try:
        wait_for_probe(server.url.removesuffix("/mcp"), "/readyz", 200)
        answers = asyncio.run(_long_polls_across_sigterm(server, 3))
        assert server.process.wait(timeout=20) in (0, -15)
    finally:
        server.stop()
    for answer in answers:
        assert answer["result"]["structuredContent"]["status"] == "working", answer
    first = server.log()
    upgraded = [line for line in first.splitlines() if "database schema upgraded" in line]
    assert len(upgraded) == 1 and upgraded[0].endswith(
        f"handles: database schema upgraded from empty to {migrate.head_revision()}"
    ), first
    listening = [line for line in first.splitlines() if "serving MCP on" in line]
    assert len(listening) == 1, first
    assert listening[0].endswith(f"serving MCP on {server.url} (health: /healthz, /readyz)"), first
    for noise in ("alembic", "Terminating session", "ASGI callable returned without completing response"):
        assert noise not in first, f"{noise!r} in the log:\n{first}"
    assert "Traceback" not in first and "ERROR" not in first, first

    server.start()  # the same database again: nothing to migrate, nothing said about it
    try:
        wait_for_probe(server.url.removesuffix("/mcp"), "/readyz", 200)
    finally:
        server.stop()
    second = server.log()[len(first) :]
    assert "schema" not in second and "alembic" not in second, second
    assert second.count("serving MCP on") == 1, second
