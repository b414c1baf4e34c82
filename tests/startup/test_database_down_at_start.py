"""An HTTP node whose PostgreSQL is down when it starts: it serves, says not-ready, and recovers by itself.

The database is reached through the TCP relay of tests/harness/relay.py, switched off at start-up and on
later; the node is the example server as a subprocess over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from sqlalchemy import create_engine

from handles import Handles, backoff
from handles.server.health import Readiness
from handles.store import migrate
from tests.durability.harness import example_node
from tests.harness.relay import Relay
from tests.startup.support import UNREACHABLE_URL, probe, wait_for_probe
from tests.support import handles_config


@pytest.fixture
def relay(postgres_url: str) -> Iterator[Relay]:
    """A relay to PostgreSQL (a schema at the newest revision), not accepting connections yet."""
    engine = create_engine(postgres_url)
    migrate.upgrade(engine)
    engine.dispose()
    relay = Relay(5432, http=False)
    try:
        yield relay
    finally:
        relay.close()


async def _start_report(url: str) -> tuple[dict[str, Any], bool]:
    async with Client(url) as client:
        result = await client.call_tool("generate_report_start", {"account": "acme", "months": 2})
    if result.structured_content is not None:
        return result.structured_content, bool(result.is_error)
    return json.loads(result.content[0].text), bool(result.is_error)  # type: ignore[union-attr]


def test_node_serves_not_ready_then_becomes_ready_when_the_database_comes_up(
    tmp_path: Path, relay: Relay, postgres_url: str
) -> None:
    server = example_node(
        tmp_path, HANDLES_DATABASE_URL=relay.database_url(postgres_url), EXAMPLE_JOB_SECONDS="0.5"
    )
    server.start()  # returns once it listens: the node did not die
    base = server.url.removesuffix("/mcp")
    try:
        assert probe(base, "/healthz") == (200, {"status": "ok"})
        assert probe(base, "/readyz") == (503, {"status": "not_ready", "reason": "database unreachable"})
        refused, is_error = asyncio.run(_start_report(server.url))
        assert is_error and refused["error"] == "store_unavailable" and refused["retryable"] is True, refused
        assert "Retry" in refused["next"]

        relay.up()
        assert wait_for_probe(base, "/readyz", 200, timeout=30) == {"status": "ready"}
        started, is_error = asyncio.run(_start_report(server.url))
        assert not is_error and started["status"] in ("working", "completed"), started

        relay.down()  # the database goes away while the node runs: not ready, then ready again
        body = wait_for_probe(base, "/readyz", 503, timeout=10)
        assert body == {"status": "not_ready", "reason": "database unreachable"}
        relay.up()
        assert wait_for_probe(base, "/readyz", 200, timeout=30) == {"status": "ready"}
    finally:
        server.stop()
    log = server.log()
    assert "Traceback" not in log, log[-3000:]
    attempts = [line for line in log.splitlines() if "start-up attempt" in line]
    assert attempts and all("WARNING" in line and "Cannot reach the database" in line for line in attempts), (
        log
    )
    assert "the job runtime has started" in log


def test_node_waiting_for_its_database_stops_cleanly_on_sigterm(
    tmp_path: Path, relay: Relay, postgres_url: str
) -> None:
    server = example_node(tmp_path, HANDLES_DATABASE_URL=relay.database_url(postgres_url))
    server.start()
    try:
        base = server.url.removesuffix("/mcp")
        assert probe(base, "/readyz")[0] == 503
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=10) in (0, -15)
    finally:
        server.stop()
    log = server.log()
    assert "Traceback" not in log and "ERROR" not in log, log[-3000:]


async def test_each_start_up_retry_waits_the_delay_its_log_line_names(
    tmp_path: Path, signing_key: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    draws = iter([0.99, 0.0] * 3)  # the jitter: highest, then lowest, and so on
    monkeypatch.setattr(backoff.random, "random", lambda: next(draws))
    jobs = Handles(handles_config(tmp_path, [signing_key], database_url=UNREACHABLE_URL))
    began: list[float] = []
    failed: list[float] = []
    start = jobs.start

    async def timed_start() -> None:
        began.append(time.monotonic())
        try:
            await start()
        finally:
            failed.append(time.monotonic())

    monkeypatch.setattr(jobs, "start", timed_start)
    readiness = Readiness(jobs)
    caplog.set_level(logging.WARNING, logger="handles")
    try:
        await readiness.begin()
        while len(began) < 3:
            await asyncio.sleep(0.05)
    finally:
        await readiness.cancel()
        await jobs.aclose()
    logged = [
        float(re.findall(r"Retrying in ([\d.]+)s", record.getMessage())[0]) for record in caplog.records
    ]
    waited = [began[n + 1] - failed[n] for n in range(2)]
    assert all(said - 0.05 <= slept <= said + 0.5 for said, slept in zip(logged, waited, strict=False)), (
        logged,
        waited,
    )
    assert logged[:2] == [0.6, 1.0], logged  # each delay drawn once: the highest jitter, then the lowest
