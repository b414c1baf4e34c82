"""A switch flipped on one node takes effect on another: two example servers on one PostgreSQL database
(the multi-node harness), the switches set with the real `handles` command from node a's environment,
and node b obeying within `HANDLES_SWITCH_CACHE_SECONDS`, while the tasks and jobs that exist go on."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp_types import CallToolResult

from handles.client.tasks import CreateTaskResult, TasksClientExtension, cancel_task
from tests.multinode.conftest import Cluster, cluster, node_env, pg_url  # noqa: F401 (fixtures)
from tests.reliability.support import report
from tests.support import approve_deploy_task, result_body, wait_task

pytestmark = pytest.mark.timeout(180)

CACHE_SECONDS = 3.0
"""Longer than the `handles` command takes to run, so the node's copy read just before it is still held."""
SLACK_SECONDS = 0.2
"""Timer jitter: every call sent later than the bound (plus this) after a switch was set must obey it."""
NODE = {"HANDLES_SWITCH_CACHE_SECONDS": str(CACHE_SECONDS), "EXAMPLE_JOB_SECONDS": "0.5"}


def operator(tmp: Path, database_url: str, *args: str) -> str:
    """`handles ARGS` with node a's environment (its host, its database, its keys)."""
    done = subprocess.run(
        [sys.executable, "-m", "handles.cli", *args],
        env=node_env(tmp, database_url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


async def stale_for(set_at: float, probe: Callable[[], Awaitable[bool]]) -> float:
    """Probe every 50 ms until a probe sees the switch: how long after `set_at` the last probe that did not
    see it was sent (0 when the first one saw it). Send times, not answer times: a slow answer under load
    does not count against the node."""
    stale = 0.0
    while True:
        sent = time.monotonic()
        if await probe():
            return stale
        stale = sent - set_at
        assert stale < CACHE_SECONDS + 10, "the switch never took effect"
        await asyncio.sleep(0.05)


def test_a_switch_set_on_one_node_takes_effect_on_the_other(
    cluster: Cluster,  # noqa: F811
    pg_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    a, b = cluster.server("a", **NODE), cluster.server("b", **NODE)

    async def main() -> dict[str, float]:
        async with (
            Client(a.url, extensions=[TasksClientExtension()]) as on_a,
            Client(b.url, extensions=[TasksClientExtension()]) as on_b,
            Client(a.url) as plain_a,
            Client(b.url) as plain_b,
        ):

            async def create(client: Client, tool: str, **arguments: Any) -> Any:
                return await client.session.call_tool(tool, arguments, allow_claimed=True)

            # Tasks created on a; node b has read the switches (its copy is warm) and creates one too.
            answered = await create(on_a, "deploy_release", version="3.1")
            dropped = await create(on_a, "deploy_release", version="3.2")
            assert isinstance(
                await create(on_b, "generate_report", account="acme", months=1), CreateTaskResult
            )
            assert isinstance(answered, CreateTaskResult) and isinstance(dropped, CreateTaskResult)

            operator(tmp_path, pg_url, "tasks", "off", "--by", "alice")
            set_at = time.monotonic()

            async def b_makes_no_task() -> bool:
                answer = await create(on_b, "generate_report", account="acme", months=1)
                return not isinstance(answer, CreateTaskResult)

            kill_switch_stale_seconds = await stale_for(set_at, b_makes_no_task)
            assert kill_switch_stale_seconds <= CACHE_SECONDS + SLACK_SECONDS
            inline = await create(on_b, "generate_report", account="acme", months=2)
            assert isinstance(inline, CallToolResult) and not inline.is_error
            assert result_body(inline)["months"] == 2, "answered inline, as a caller without the extension"

            # Node b serves the tasks node a created before the switch: read, answered, cancelled.
            await approve_deploy_task(on_b, answered.task_id, "staging")
            await wait_task(on_b, dropped.task_id, "input_required")
            await cancel_task(on_b.session, dropped.task_id)
            assert (await wait_task(on_b, dropped.task_id, "cancelled")).status == "cancelled"

            # A pause set from node a's environment: node a refuses new deployments, while one that b
            # started before, waiting for its approval, is answered on a and goes on to its result.
            parked = result_body(await plain_b.call_tool("deploy_release_start", {"version": "3.3"}))[
                "handle"
            ]
            for _ in range(40):
                state = result_body(
                    await plain_a.call_tool("deploy_release_progress", {"handle": parked, "wait_seconds": 2})
                )
                if state["status"] == "input_required":
                    break
            assert state["status"] == "input_required"
            # Node a reads the switches now (a start does), so it holds a copy from just before the pause.
            assert not (await plain_a.call_tool("generate_report_start", {"account": "warm"})).is_error
            operator(
                tmp_path, pg_url, "jobs", "pause", "deploy_release", "--retry-after", "20s", "--by", "bob"
            )
            set_at = time.monotonic()

            async def a_refuses() -> bool:
                answer = await plain_a.call_tool("deploy_release_start", {"version": "4.0"})
                return bool(answer.is_error) and result_body(answer)["error"] == "paused"

            pause_stale_seconds = await stale_for(set_at, a_refuses)
            assert pause_stale_seconds <= CACHE_SECONDS + SLACK_SECONDS
            refusal = result_body(await plain_b.call_tool("deploy_release", {"version": "4.0"}))
            assert refusal["retryable"] is True and refusal["retry_after_seconds"] == 20
            await plain_a.call_tool(
                "deploy_release_respond",
                {"handle": parked, "responses": {"q1": {"approve": True, "environment": "production"}}},
            )
            fetched = result_body(
                await plain_b.call_tool("deploy_release_fetch", {"handle": parked, "wait_seconds": 20})
            )
            assert fetched["status"] == "completed" and fetched["result"]["environment"] == "production"

            # Both released from node a's environment: node b creates tasks and starts deployments again.
            operator(tmp_path, pg_url, "jobs", "unpause", "deploy_release", "--by", "bob")
            assert not (await plain_b.call_tool("generate_report_start", {"account": "warm"})).is_error
            operator(tmp_path, pg_url, "tasks", "on", "--by", "alice")
            set_at = time.monotonic()

            async def b_is_back() -> bool:
                task = await create(on_b, "deploy_release", version="4.0")
                return isinstance(task, CreateTaskResult)

            release_stale_seconds = await stale_for(set_at, b_is_back)
            assert release_stale_seconds <= CACHE_SECONDS + SLACK_SECONDS
            return {
                "kill_switch_stale_seconds": round(kill_switch_stale_seconds, 3),
                "pause_stale_seconds": round(pause_stale_seconds, 3),
                "release_stale_seconds": round(release_stale_seconds, 3),
            }

    figures = asyncio.run(main())
    for node in (a, b):
        assert "operator switch tasks engaged by alice" in node.log()
    report("switch_across_nodes", {"cache_seconds": CACHE_SECONDS, **figures})
