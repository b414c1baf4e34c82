"""SIGTERM of a single SQLite node: in-flight jobs finish before the process exits (issue 12, item 1)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from tests.harness.process import ServerProcess, python_module
from tests.support import FRAMEWORKS

from .harness import example_node, stored_jobs


async def _start(url: str, tool: str, **arguments: Any) -> str:
    async with Client(url) as client:
        result = await client.call_tool(tool, arguments)
    assert result.structured_content is not None, result
    return str(result.structured_content["handle"])


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_sigterm_lets_in_flight_jobs_finish_before_the_process_exits(tmp_path: Path, framework: str) -> None:
    server = example_node(
        tmp_path, framework, EXAMPLE_JOB_SECONDS="2", HANDLES_LEASE_SECONDS="5", HANDLES_DRAIN_SECONDS="25"
    )
    server.start()
    try:
        handles = asyncio.run(_start_all(server.url))
        time.sleep(0.5)
        code, took = _terminated(server, timeout=30)
    finally:
        server.stop()
    # uvicorn re-raises the signal it caught once it has shut down cleanly: -SIGTERM, or 0
    assert code in (0, -15), server.log()[-3000:]
    assert took < 10, f"{took:.1f}s to stop"
    statuses = {h: job.status for h, job in zip(handles, stored_jobs(tmp_path, *handles), strict=True)}
    assert set(statuses.values()) == {"completed"}, statuses


def _terminated(server: ServerProcess, timeout: float) -> tuple[int, float]:
    """SIGTERM `server` and wait for it to exit: its exit code, and the seconds it took."""
    began = time.monotonic()
    server.process.terminate()
    code = server.process.wait(timeout=timeout)
    return code, time.monotonic() - began


def _signalled_twice(server: ServerProcess) -> tuple[int, float]:
    """SIGTERM `server`, check a second later that it is still draining its running jobs, and SIGTERM it
    again: its exit code, and the seconds it took to exit after the second signal."""
    server.process.terminate()
    time.sleep(1.0)
    assert server.process.poll() is None, "the first signal drains: the running jobs are still running"
    return _terminated(server, timeout=15)


async def _start_all(url: str) -> list[str]:
    reports = [await _start(url, "generate_report_start", account=f"a{i}", months=4) for i in range(3)]
    exports = [await _start(url, "export_dataset_start", rows=100) for _ in range(2)]
    return reports + exports


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_sigterm_answers_open_long_polls_at_once_and_refuses_new_work_retryably(
    tmp_path: Path, framework: str
) -> None:
    """A client waiting on a long job gets its answer (still working) at the signal, not a dropped
    connection after the drain; it then follows the job elsewhere (here: after the restart)."""
    server = example_node(
        tmp_path, framework, EXAMPLE_JOB_SECONDS="6", HANDLES_LEASE_SECONDS="5", HANDLES_DRAIN_SECONDS="25"
    )
    server.start()

    async def main() -> tuple[dict[str, Any], float]:
        handle = await _start(server.url, "generate_report_start", account="acme", months=6)
        async with Client(server.url) as client:
            poll = asyncio.create_task(
                client.call_tool("generate_report_fetch", {"handle": handle, "wait_seconds": 30})
            )
            await asyncio.sleep(0.5)
            began = time.monotonic()
            server.process.terminate()
            result = await asyncio.wait_for(poll, 10)
            took = time.monotonic() - began
        assert result.structured_content is not None, result
        return result.structured_content, took

    try:
        body, took = asyncio.run(main())
        code = server.process.wait(timeout=30)
    finally:
        server.stop()
    assert body["status"] == "working", body
    assert took < 2, f"the long-poll was answered {took:.1f}s after the signal"
    assert code in (0, -15)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_second_sigterm_ends_the_drain_and_hands_running_jobs_over_at_once(
    tmp_path: Path, framework: str
) -> None:
    """The first signal drains (jobs may finish for `drain_seconds`); a second one means "stop now": the
    jobs still running are handed over at once (a `retry` job released for any node, any other failed as
    interrupted by a shutdown), and the process exits without waiting out the drain."""
    server = example_node(
        tmp_path, framework, EXAMPLE_JOB_SECONDS="60", HANDLES_LEASE_SECONDS="30", HANDLES_DRAIN_SECONDS="25"
    )
    server.start()
    try:
        report = asyncio.run(_start(server.url, "generate_report_start", account="acme", months=3))
        export = asyncio.run(_start(server.url, "export_dataset_start", rows=100))
        time.sleep(0.5)
        code, took = _signalled_twice(server)
    finally:
        server.stop()
    assert code in (0, -15), server.log()[-3000:]
    assert took < 10, f"{took:.1f}s to stop after the second signal"
    assert "drain ended early: 2 running job(s) are handed over now" in server.log()
    retried, failed = stored_jobs(tmp_path, report, export)
    assert retried.status == "working" and retried.lease_owner is None, (retried.status, retried.lease_owner)
    assert retried.status_message == "Its server is shutting down; another server continues it now."
    assert failed.status == "failed" and "shut" in (failed.status_message or "").lower(), (
        failed.status_message
    )


def test_a_second_sigterm_ends_a_workers_drain_and_hands_its_job_over(tmp_path: Path) -> None:
    """`handles worker` stops as the servers do: the first signal drains, a second one hands over now."""
    web = example_node(
        tmp_path, HANDLES_RUN_WORKERS="0", EXAMPLE_JOB_SECONDS="60", HANDLES_LEASE_SECONDS="30"
    )
    worker = ServerProcess(
        python_module("handles.cli", "worker", "--app", "example_server.server:create_jobs"),
        {**web.env, "HANDLES_RUN_WORKERS": "1", "HANDLES_DRAIN_SECONDS": "25"},
        tmp_path / "worker.log",
        None,
        name="the worker",
        ready_line=" running jobs ",
    )
    web.start()
    try:
        worker.start()
        report = asyncio.run(_start(web.url, "generate_report_start", account="acme", months=3))
        deadline = time.monotonic() + 10
        while stored_jobs(tmp_path, report)[0].lease_owner is None:
            assert time.monotonic() < deadline, "the worker did not take the job"
            time.sleep(0.1)
        code, took = _signalled_twice(worker)
    finally:
        worker.stop()
        web.stop()
    assert code == 0, worker.log()[-3000:]
    assert took < 10, f"{took:.1f}s to stop after the second signal"
    assert "drain ended early: 1 running job(s) are handed over now" in worker.log()
    (retried,) = stored_jobs(tmp_path, report)
    assert retried.status == "working" and retried.lease_owner is None, (retried.status, retried.lease_owner)
