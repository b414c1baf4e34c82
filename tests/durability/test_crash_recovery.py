"""kill -9 the example server (a real subprocess) mid-job, restart it on the same database, follow the same handle."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from tests.harness.process import ServerProcess
from tests.support import FRAMEWORKS

from .harness import example_node


@pytest.fixture(params=FRAMEWORKS)
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """The example server on each framework (the SDK's `MCPServer`, FastMCP 4)."""
    effects = tmp_path / "effects.log"
    process = example_node(
        tmp_path, request.param, EXAMPLE_JOB_SECONDS="3", EXAMPLE_EFFECTS_FILE=str(effects)
    )
    process.start()
    yield process
    process.stop()


async def _call(url: str, tool: str, **arguments: Any) -> tuple[dict[str, Any], bool]:
    async with Client(url) as client:
        result = await client.call_tool(tool, arguments)
    assert result.structured_content is not None, result
    return result.structured_content, bool(result.is_error)


async def _until(url: str, job: str, handle: str, predicate: Any, timeout: float = 30) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        state, _ = await _call(url, f"{job}_progress", handle=handle, wait_seconds=1)
        if predicate(state):
            return state
    raise AssertionError(f"{job} never reached the expected state; last: {state}")


def test_kill_9_with_fail_policy_ends_failed_interrupted(server: ServerProcess) -> None:
    async def main() -> None:
        started, _ = await _call(server.url, "export_dataset_start", rows=1000)
        handle = started["handle"]
        await _until(server.url, "export_dataset", handle, lambda s: (s["progress"]["done"] or 0) > 0)
        server.kill()
        server.start()
        body, is_error = await _call(server.url, "export_dataset_fetch", handle=handle, wait_seconds=20)
        assert is_error and body["status"] == "failed", body
        assert body["error"]["data"]["reason"] == "interrupted"
        assert "outcome is unknown" in body["error"]["message"]
        assert "reconcile" in body["error"]["message"]
        progress, _ = await _call(server.url, "export_dataset_progress", handle=handle)
        assert progress["status"] == "failed" and progress["attempts"] == 1

    asyncio.run(main())


def test_kill_9_with_retry_policy_completes_without_repeating_steps(
    server: ServerProcess, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"

    async def main() -> None:
        started, _ = await _call(server.url, "deploy_release_start", version="9.9.9")
        handle = started["handle"]
        await _until(server.url, "deploy_release", handle, lambda s: s["status"] == "input_required")
        answer = {"q1": {"approve": True, "environment": "production"}}
        replied, _ = await _call(server.url, "deploy_release_respond", handle=handle, responses=answer)
        assert replied["accepted"] == ["q1"]
        await _until(
            server.url,
            "deploy_release",
            handle,
            lambda s: any(step["name"] == "upload" and step["status"] == "completed" for step in s["steps"]),
        )
        server.kill()
        server.start()
        body, is_error = await _call(server.url, "deploy_release_fetch", handle=handle, wait_seconds=30)
        assert not is_error and body["status"] == "completed", body
        assert body["result"]["environment"] == "production"
        progress, _ = await _call(server.url, "deploy_release_progress", handle=handle)
        assert progress["attempts"] == 2
        upload = next(s for s in progress["steps"] if s["name"] == "upload")
        assert upload["attempt"] == 1, (
            "the upload was recorded by the first attempt and replayed by the second"
        )

    asyncio.run(main())
    lines = effects.read_text().splitlines()
    assert lines == [
        "upload 9.9.9 to production",
        "migrate 9.9.9 to production",
        "switch traffic 9.9.9 to production",
    ], lines


def test_kill_9_inside_a_repeatable_step_runs_it_again_in_the_retry(tmp_path: Path) -> None:
    """deploy_release's build, test and package are safe to repeat: killed in the middle of one, the job is
    retried, runs that step again, and goes on to its question, where a step with an effect would have failed
    it for reconciliation."""
    effects = tmp_path / "effects.log"
    node = example_node(tmp_path, EXAMPLE_JOB_SECONDS="12", EXAMPLE_EFFECTS_FILE=str(effects))  # 2 s a step

    def running_step(state: dict[str, Any]) -> str | None:
        return next((step["name"] for step in state["steps"] if step["status"] == "started"), None)

    async def main() -> None:
        started, _ = await _call(node.url, "deploy_release_start", version="7.1.0")
        handle = started["handle"]
        killed_in = running_step(await _until(node.url, "deploy_release", handle, running_step))
        node.kill()
        node.start()
        asked = await _until(node.url, "deploy_release", handle, lambda s: s["status"] != "working")
        assert asked["status"] == "input_required", asked
        assert asked["attempts"] == 2
        rerun = next(s for s in asked["steps"] if s["name"] == killed_in)
        assert (rerun["status"], rerun["attempt"]) == ("completed", 2), f"the retry ran {killed_in} again"
        answer = {"q1": {"approve": True, "environment": "staging"}}
        await _call(node.url, "deploy_release_respond", handle=handle, responses=answer)
        body, is_error = await _call(node.url, "deploy_release_fetch", handle=handle, wait_seconds=30)
        assert not is_error and body["status"] == "completed", body

    with node.running():
        asyncio.run(main())
    assert effects.read_text().splitlines() == [
        "upload 7.1.0 to staging",
        "migrate 7.1.0 to staging",
        "switch traffic 7.1.0 to staging",
    ]
