"""`/healthz` and `/readyz` of the example server over real HTTP: ready once started, 503 while draining."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from mcp import Client

from tests.durability.harness import example_node
from tests.startup.support import probe, wait_for_probe


async def _start_report(url: str) -> None:
    async with Client(url) as client:
        result = await client.call_tool("generate_report_start", {"account": "acme", "months": 4})
    assert result.structured_content is not None, result


def test_ready_after_start_then_not_ready_while_draining(tmp_path: Path) -> None:
    server = example_node(tmp_path, EXAMPLE_JOB_SECONDS="4", HANDLES_DRAIN_SECONDS="10")
    server.start()
    base = server.url.removesuffix("/mcp")
    try:
        assert probe(base, "/healthz") == (200, {"status": "ok"})
        assert wait_for_probe(base, "/readyz", 200) == {"status": "ready"}
        asyncio.run(_start_report(server.url))  # a running job keeps the drain going for a few seconds
        server.process.send_signal(signal.SIGTERM)
        body = wait_for_probe(base, "/readyz", 503, timeout=3)
        assert body == {"status": "not_ready", "reason": "shutting down (draining)"}
        assert probe(base, "/healthz") == (200, {"status": "ok"})  # alive: do not restart a draining node
        began = time.monotonic()
        assert server.process.wait(timeout=20) in (0, -15), server.log()[-3000:]
        assert time.monotonic() - began < 8
    finally:
        server.stop()
    assert "Traceback" not in server.log()
