"""Three nodes on one PostgreSQL: any node answers, claims are exclusive, a dead node's job is recovered,
and a database outage gives clear retryable errors and heals by itself."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from sqlalchemy import create_engine, text

from handles.client.tasks import TasksClientExtension, get_task
from tests.harness.relay import Relay
from tests.support import count_active

from .conftest import Cluster


async def call(url: str, tool: str, **arguments: Any) -> tuple[dict[str, Any], bool]:
    async with Client(url) as client:
        result = await client.call_tool(tool, arguments)
    if result.structured_content is not None:
        return result.structured_content, bool(result.is_error)
    return json.loads(result.content[0].text), bool(result.is_error)  # type: ignore[union-attr]


async def ok(url: str, tool: str, **arguments: Any) -> dict[str, Any]:
    body, is_error = await call(url, tool, **arguments)
    assert not is_error, body
    return body


def test_one_job_driven_through_every_node(cluster: Cluster) -> None:
    # Heartbeats 20 s apart (no node dies here): a cancel can reach the node running a 6 s job
    # in time only through LISTEN/NOTIFY.
    a, b, c = (
        cluster.server(
            name, EXAMPLE_JOB_SECONDS="6", HANDLES_LEASE_SECONDS="60", HANDLES_HEARTBEAT_SECONDS="20"
        )
        for name in "abc"
    )

    async def main() -> None:
        started = await ok(a.url, "deploy_release_start", version="1.0.0")
        handle = started["handle"]
        for _ in range(40):
            state = await ok(b.url, "deploy_release_progress", handle=handle, wait_seconds=2)
            if state["status"] == "input_required":
                break
        assert state["input_requests"]["q1"]["message"].startswith("Release 1.0.0")
        replied = await ok(
            c.url,
            "deploy_release_respond",
            handle=handle,
            responses={"q1": {"approve": True, "environment": "staging"}},
        )
        assert replied["accepted"] == ["q1"]
        done = await ok(b.url, "deploy_release_fetch", handle=handle, wait_seconds=20)
        assert done["status"] == "completed" and done["result"]["environment"] == "staging"
        again = await ok(c.url, "deploy_release_fetch", handle=handle)
        assert again["result"] == done["result"]
        # the same job through the Tasks face, on a third node: the handle is the taskId
        async with Client(c.url, extensions=[TasksClientExtension()]) as client:
            task = await get_task(client.session, handle)
        assert task.status == "completed"
        assert task.result is not None and task.result["structuredContent"] == done["result"]

        export = (await ok(a.url, "export_dataset_start", rows=500))["handle"]
        await ok(b.url, "export_dataset_progress", handle=export, wait_seconds=2)
        began = time.monotonic()
        cancel = await ok(c.url, "export_dataset_cancel", handle=export)
        assert cancel["cancel_requested"] is True
        final = await ok(b.url, "export_dataset_fetch", handle=export, wait_seconds=10)
        # The node running it heard about the cancel through LISTEN/NOTIFY, not at its next heartbeat
        # (20 s away): the job was stopped before its 6 s were up.
        assert final["status"] == "cancelled"
        assert time.monotonic() - began < 5.0

    asyncio.run(main())


def test_claims_are_exclusive_across_worker_processes(
    cluster: Cluster, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tmp_path / "runs.log"
    runs.touch()
    for name in ("w1", "w2", "w3"):
        cluster.worker(name, "tests.multinode.app:create_jobs", MULTINODE_RUNS_FILE=str(runs))
    monkeypatch.setenv("HANDLES_DATABASE_URL", pg_url)
    monkeypatch.setenv("HANDLES_SECRET_KEYS", "multinode-test-key-" + "m" * 32)
    monkeypatch.setenv("HANDLES_RUN_WORKERS", "0")
    monkeypatch.setenv("HANDLES_MAX_ACTIVE_PER_PRINCIPAL", "1000")
    from tests.multinode.app import create_jobs

    jobs = create_jobs()
    total = 300

    async def main() -> None:
        spec = jobs.specs["count_me"]
        ids = [(await jobs.service.start(spec, "local:local", {"n": i}, None)).job.id for i in range(total)]
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if count_active(jobs.service.store.repo) == 0:
                break
            await asyncio.sleep(0.2)
        for job_id in ids:
            job = jobs.service.store.repo.get(job_id)
            assert job is not None and job.status == "completed", job
        await jobs.aclose()
        lines = runs.read_text().split()
        executed = Counter(lines[0::2])
        assert set(executed) == set(ids)
        assert max(executed.values()) == 1, [j for j, n in executed.items() if n > 1]
        assert len(set(lines[1::2])) >= 2, "the work was shared between worker processes"

    asyncio.run(main())


def _lease_owner_pid(database_url: str) -> int:
    engine = create_engine(database_url)
    with engine.connect() as connection:
        owner = connection.execute(
            text("select lease_owner from handles_jobs where status = 'working'")
        ).scalar_one()
    engine.dispose()
    return int(owner.split(":")[1])


def test_killed_node_job_is_recovered_by_another_within_lease_plus_sweep(
    cluster: Cluster, pg_url: str
) -> None:
    nodes = [cluster.server(name, EXAMPLE_JOB_SECONDS="30") for name in "ab"]

    async def main() -> None:
        handle = (await ok(nodes[0].url, "export_dataset_start", rows=1000))["handle"]
        for _ in range(20):
            state = await ok(nodes[1].url, "export_dataset_progress", handle=handle, wait_seconds=2)
            if state["attempts"] == 1:
                break
        running = _lease_owner_pid(pg_url)
        victim = next(n for n in nodes if n.process is not None and n.process.pid == running)
        survivor = next(n for n in nodes if n is not victim)
        victim.kill()
        killed = time.monotonic()
        body, is_error = await call(survivor.url, "export_dataset_fetch", handle=handle, wait_seconds=15)
        elapsed = time.monotonic() - killed
        assert is_error and body["status"] == "failed" and body["error"]["data"]["reason"] == "interrupted", (
            body
        )
        # lease 1.5 s + one sweep 0.3 s, plus the store poll of the waiting node (1 s) and slack
        assert elapsed < 5.0, elapsed

    asyncio.run(main())


def test_database_outage_gives_retryable_errors_and_heals(cluster: Cluster, pg_url: str) -> None:
    proxy = Relay(5432, http=False).up()
    try:
        node = cluster.server("a", EXAMPLE_JOB_SECONDS="1")
        node.env["HANDLES_DATABASE_URL"] = proxy.database_url(pg_url)
        node.stop()
        node.start()

        async def main() -> None:
            before = await ok(node.url, "generate_report_start", account="acme", months=2)
            await ok(node.url, "generate_report_fetch", handle=before["handle"], wait_seconds=10)
            proxy.down()
            failed, is_error = await call(node.url, "generate_report_start", account="acme", months=2)
            assert is_error and failed["error"] == "store_unavailable" and failed["retryable"] is True, failed
            assert "handle" not in failed and "nothing was changed" in failed["message"]
            polled, is_error = await call(node.url, "generate_report_progress", handle=before["handle"])
            assert is_error and polled["error"] == "store_unavailable"
            proxy.up()
            for _ in range(50):
                body, is_error = await call(node.url, "generate_report_start", account="acme", months=2)
                if not is_error:
                    break
                await asyncio.sleep(0.2)
            assert not is_error, body
            done = await ok(node.url, "generate_report_fetch", handle=body["handle"], wait_seconds=10)
            assert done["status"] == "completed"
            old = await ok(node.url, "generate_report_fetch", handle=before["handle"])
            assert old["status"] == "completed"

        asyncio.run(main())
    finally:
        proxy.close()
