"""Deploys and crashes against real processes on PostgreSQL (issue 12).

A rolling restart of both nodes while 20 `retry` jobs run and 20 jobs wait for approval loses,
fails and repeats nothing; a parked job answered after its node was killed completes on the other.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

from mcp import Client

from handles.store import JobRepository
from tests.harness.process import ServerProcess

from .conftest import KEY, Cluster


async def _call(url: str, tool: str, **arguments: Any) -> dict[str, Any]:
    for attempt in range(40):  # a node may be restarting: retry on another moment, as a client would
        try:
            async with Client(url) as client:
                result = await client.call_tool(tool, arguments)
            body = result.structured_content
            assert body is not None, result
            if body.get("error") == "shutting_down":
                raise ConnectionError("draining")
            return body
        except Exception:
            if attempt == 39:
                raise
            await asyncio.sleep(0.25)
    raise AssertionError("unreachable")


async def _any(nodes: list[ServerProcess], tool: str, **arguments: Any) -> dict[str, Any]:
    last: Exception | None = None
    for _ in range(20):
        for node in nodes:
            if node.process is None or node.process.poll() is not None:
                continue
            try:
                return await _call(node.url, tool, **arguments)
            except Exception as exc:
                last = exc
        await asyncio.sleep(0.25)
    raise AssertionError(f"no node answered {tool}: {last!r}")


def _graceful_restart(node: ServerProcess, budget: float) -> float:
    assert node.process is not None
    began = time.monotonic()
    node.process.terminate()
    code = node.process.wait(timeout=budget)
    took = time.monotonic() - began
    assert code in (0, -15), f"{node.name} exited {code}:\n{node.log()[-3000:]}"
    node.start()
    return took


async def _wait_status(
    nodes: list[ServerProcess], job: str, handle: str, statuses: set[str], timeout: float
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:
        state = await _any(nodes, f"{job}_progress", handle=handle, wait_seconds=2)
        if state.get("status") in statuses:
            return state
    raise AssertionError(f"{job} stayed {state.get('status')}: {state}")


def test_rolling_restart_of_two_nodes_loses_fails_and_repeats_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.txt"
    env = {
        "EXAMPLE_JOB_SECONDS": "6",
        "EXAMPLE_EFFECTS_FILE": str(effects),
        "HANDLES_DRAIN_SECONDS": "2",
        "HANDLES_STORE_POLL_SECONDS": "0.2",
    }
    a, b = cluster.server("a", **env), cluster.server("b", **env)
    nodes = [a, b]

    async def main() -> None:
        deploys = [
            (await _call(nodes[i % 2].url, "deploy_release_start", version=f"v{i}"))["handle"]
            for i in range(20)
        ]
        for handle in deploys:
            await _wait_status(nodes, "deploy_release", handle, {"input_required"}, 60)
        reports = [
            (await _call(nodes[i % 2].url, "generate_report_start", account=f"acct{i}", months=12))["handle"]
            for i in range(20)
        ]
        await asyncio.sleep(1.0)
        took_a = await asyncio.to_thread(_graceful_restart, a, 40)
        for handle in deploys[:10]:  # answered between the two restarts: some resume on b, then move
            await _any(
                nodes,
                "deploy_release_respond",
                handle=handle,
                responses={"q1": {"approve": True, "environment": "staging"}},
            )
        await asyncio.sleep(1.5)
        took_b = await asyncio.to_thread(_graceful_restart, b, 40)
        for handle in deploys[10:]:
            await _any(
                nodes,
                "deploy_release_respond",
                handle=handle,
                responses={"q1": {"approve": True, "environment": "staging"}},
            )
        finals = {}
        for job, handle in [("deploy_release", h) for h in deploys] + [
            ("generate_report", h) for h in reports
        ]:
            finals[handle] = await _wait_status(nodes, job, handle, {"completed", "failed", "cancelled"}, 120)
        statuses = Counter(state["status"] for state in finals.values())
        assert statuses == {"completed": 40}, statuses
        assert took_a < 15 and took_b < 15, (took_a, took_b)
        lines = Counter(effects.read_text().splitlines())
        assert len(lines) == 60 and set(lines.values()) == {1}, [line for line, n in lines.items() if n != 1]
        repo = JobRepository(cluster.database_url)
        try:
            failed_attempts = [h for h in deploys if repo.get(job_id_of_multinode(h)).attempts != 1]  # type: ignore[union-attr]
        finally:
            repo.dispose()
        assert failed_attempts == [], "a resume or a hand-over was counted as a failed attempt"

    asyncio.run(main())


def job_id_of_multinode(handle: str) -> str:
    from handles.handle import HandleCodec

    claims = HandleCodec([KEY]).inspect(handle)
    assert claims is not None
    return claims.job_id


def test_a_parked_job_answered_after_its_node_was_killed_completes_on_the_other(
    cluster: Cluster, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.txt"
    env = {"EXAMPLE_JOB_SECONDS": "1", "EXAMPLE_EFFECTS_FILE": str(effects), "HANDLES_LEASE_SECONDS": "30"}
    a, b = cluster.server("a", **env), cluster.server("b", **env)

    async def main() -> None:
        handle = (await _call(a.url, "deploy_release_start", version="9.9"))["handle"]
        await _wait_status([a], "deploy_release", handle, {"input_required"}, 30)
        a.kill()
        began = time.monotonic()
        await _call(
            b.url,
            "deploy_release_respond",
            handle=handle,
            responses={"q1": {"approve": True, "environment": "production"}},
        )
        final = await _wait_status([b], "deploy_release", handle, {"completed", "failed", "cancelled"}, 30)
        took = time.monotonic() - began
        assert final["status"] == "completed", final
        assert took < 10, f"{took:.1f}s: the answer waited for the dead node's lease (30 s)"
        assert Counter(effects.read_text().splitlines()) == {
            "upload 9.9 to production": 1,
            "migrate 9.9 to production": 1,
            "switch traffic 9.9 to production": 1,
        }
        repo = JobRepository(cluster.database_url)
        try:
            record = repo.get(job_id_of_multinode(handle))
        finally:
            repo.dispose()
        assert record is not None and record.attempts == 1

    asyncio.run(main())
