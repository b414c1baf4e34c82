"""`handles.client` against the example server over Streamable HTTP (a subprocess): both faces agree,
a client killed while waiting resumes the same job, and a lost connection is recovered without a
second start."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from handles.client import Journal, Progress, follow
from handles.client.tasks import TasksClientExtension
from tests.support import REPO_ROOT, HttpExampleServer

pytestmark = pytest.mark.timeout(120)


def jobs_in(server: HttpExampleServer, kind: str, marker: str) -> int:
    """How many `kind` jobs whose arguments mention `marker` the server's store holds."""
    with sqlite3.connect(server.data_dir / "handles.db") as db:
        row = db.execute(
            "select count(*) from handles_jobs where kind = ? and arguments like ?", (kind, f"%{marker}%")
        ).fetchone()
    return int(row[0])


@pytest.fixture
def own_http_server(tmp_path: Path, signing_key: str) -> Iterator[HttpExampleServer]:
    """An example server over HTTP of this test alone (it may be restarted)."""
    server = HttpExampleServer(tmp_path / "server", [signing_key]).start()
    try:
        yield server
    finally:
        server.stop()


def approve(key: str, message: str, schema: dict[str, Any]) -> dict[str, Any]:
    assert set(schema["properties"]) == {"approve", "environment"}
    return {"approve": True, "environment": "production"}


async def test_both_faces_give_the_same_results_over_http(
    http_example: HttpExampleServer, tmp_path: Path
) -> None:
    account = f"acct-{uuid.uuid4().hex[:8]}"
    journal = Journal(tmp_path / "journal.db")
    seen: dict[str, list[Progress]] = {"tasks": [], "handles": []}
    results: dict[str, Any] = {}
    async with Client(http_example.url, extensions=[TasksClientExtension()]) as client:
        for face in ("tasks", "handles"):
            report = await follow(
                client,
                "generate_report",
                {"account": account, "months": 2},
                key=f"report-{face}",
                journal=journal,
                prefer=face,  # type: ignore[arg-type]
                on_progress=seen[face].append,
            )
            deployment = await follow(
                client,
                "deploy_release",
                {"version": account},
                key=f"deploy-{face}",
                journal=journal,
                prefer=face,  # type: ignore[arg-type]
                on_input=approve,
            )
            results[face] = (report, deployment)
    assert results["tasks"] == results["handles"]
    report, deployment = results["tasks"]
    assert report["account"] == account and len(report["revenue_by_month"]) == 2
    assert deployment["environment"] == "production"
    assert jobs_in(http_example, "generate_report", account) == 2
    for face in ("tasks", "handles"):
        assert seen[face][0].status == "working" and seen[face][-1].status == "completed"


def client_demo(server: HttpExampleServer, journal: Path, prefer: str, account: str) -> list[str]:
    arguments = json.dumps({"account": account, "months": 3})
    return [
        sys.executable,
        "-m",
        "example_server.client_demo",
        "generate_report",
        arguments,
        "--url",
        server.url,
        "--journal",
        str(journal),
        "--key",
        "the-report",
        "--prefer",
        prefer,
    ]


@pytest.mark.parametrize("prefer", ["tasks", "handles"])
def test_a_client_killed_while_waiting_resumes_the_same_job(
    own_http_server: HttpExampleServer, tmp_path: Path, prefer: str
) -> None:
    account = f"acct-{uuid.uuid4().hex[:8]}"
    journal_path = tmp_path / "journal.db"
    command = client_demo(own_http_server, journal_path, prefer, account)
    first = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # Wait until the client has journaled the handle and is waiting on the job, then kill it.
        deadline = time.monotonic() + 30
        handle = None
        while handle is None:
            assert time.monotonic() < deadline, "the client never recorded a handle"
            assert first.poll() is None, first.communicate()
            time.sleep(0.02)
            if journal_path.exists():
                entry = Journal(journal_path).get("the-report")
                handle = entry.handle if entry is not None else None
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
        first.communicate()
    assert first.returncode == -signal.SIGKILL
    assert jobs_in(own_http_server, "generate_report", account) == 1

    second = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0, second.stderr
    assert "resuming" in second.stderr
    result = json.loads(second.stdout.strip().splitlines()[-1])
    assert result["account"] == account and len(result["revenue_by_month"]) == 3
    assert result["total_revenue"] == round(sum(result["revenue_by_month"]), 2)
    assert jobs_in(own_http_server, "generate_report", account) == 1, "the server counted exactly one start"
    entry = Journal(journal_path).get("the-report")
    assert entry is not None and entry.handle == handle and entry.state == "completed"

    # Once ended, the same command answers from the journal.
    third = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert third.returncode == 0 and json.loads(third.stdout.strip().splitlines()[-1]) == result
    assert jobs_in(own_http_server, "generate_report", account) == 1


@pytest.mark.parametrize("prefer", ["tasks", "handles"])
async def test_a_lost_connection_is_recovered_on_a_new_client(
    own_http_server: HttpExampleServer, tmp_path: Path, prefer: str
) -> None:
    """The server restarts (on another port) while the client waits: `follow`, given a factory of
    clients, opens a new one and goes on following the same job; nothing is started twice."""
    account = f"acct-{uuid.uuid4().hex[:8]}"
    connections = 0
    restarted: list[str] = []

    @asynccontextmanager
    async def connect() -> AsyncIterator[Client]:
        nonlocal connections
        connections += 1
        async with Client(own_http_server.url, extensions=[TasksClientExtension()]) as client:
            yield client

    async def restart_once(update: Progress) -> None:
        if not restarted:
            restarted.append(update.handle)
            await anyio.to_thread.run_sync(own_http_server.restart)

    result = await follow(
        connect,
        "deploy_release",
        {"version": account},
        journal=tmp_path / "journal.db",
        key="deploy",
        prefer=prefer,  # type: ignore[arg-type]
        on_input=approve,
        on_progress=restart_once,
        server_id="the example server",
        long_poll_seconds=1,
        request_timeout=2,
    )
    assert result["version"] == account and result["environment"] == "production"
    assert restarted and connections >= 2, "the client reconnected"
    assert jobs_in(own_http_server, "deploy_release", account) == 1
    entry = Journal(tmp_path / "journal.db").get("deploy")
    assert entry is not None and entry.handle == restarted[0]
