"""The console beside a real server: `python -m example_server --http` in a subprocess, one SQLite file.

deploy_release asks its question; an operator answers it in the console; the server's job goes on
to completion, and the answer is on record as the operator's. And a cancel from the console stops a
job the server is running.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from handles.console import console_app
from handles.store import JobRepository
from tests.console.support import TOKEN, console, csrf_of
from tests.support import HttpExampleServer, InProcessExample, connect, get_input, job_id_of


@pytest.fixture
def server(tmp_path: Path, signing_key: str) -> Iterator[HttpExampleServer]:
    running = HttpExampleServer(tmp_path / "data", [signing_key]).start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def slow_server(tmp_path: Path, signing_key: str) -> Iterator[HttpExampleServer]:
    """Jobs of a minute: time for a cancel to find the job still running."""
    running = HttpExampleServer(tmp_path / "slow", [signing_key], env={"EXAMPLE_JOB_SECONDS": "60"}).start()
    try:
        yield running
    finally:
        running.stop()


def store_url(server: HttpExampleServer) -> str:
    return f"sqlite:///{(server.data_dir / 'handles.db').as_posix()}"


async def test_an_answer_from_the_console_lets_deploy_release_continue(
    server: HttpExampleServer, signing_key: str
) -> None:
    async with connect(server.url) as client:
        started = await client.call("deploy_release_start", {"version": "2.4.0"})
        handle = str(started["handle"])
        job_id = job_id_of(handle, signing_key)
        await client.wait_status("deploy_release", handle, "input_required")
        with console(store_url(server), signed_in_as="erin") as operator:
            page = operator.get(f"/jobs/{job_id}").text
            assert "2.4.0" in page and 'name="environment"' in page
            answered = operator.post(
                f"/jobs/{job_id}/answer/q1",
                data={"csrf": csrf_of(page), "approve": "true", "environment": "staging"},
            )
            assert answered.status_code == 303
        done = await client.wait_status("deploy_release", handle, "completed", timeout=60)
        fetched = await client.call("deploy_release_fetch", {"handle": handle})
        assert fetched["result"]["environment"] == "staging", done.data
    repo = JobRepository(store_url(server))
    try:
        question = get_input(repo, job_id, "q1")
        assert question is not None and question.answered_by == "operator:erin"
    finally:
        repo.dispose()


async def test_a_cancel_from_the_console_stops_a_running_job(
    slow_server: HttpExampleServer, signing_key: str
) -> None:
    server = slow_server
    async with connect(server.url) as client:
        handle = str((await client.call("export_dataset_start", {"rows": 1_000_000}))["handle"])
        job_id = job_id_of(handle, signing_key)
        await client.wait_status("export_dataset", handle, "working")
        with console(store_url(server), signed_in_as="erin") as operator:
            confirm = operator.get(f"/jobs/{job_id}/cancel").text
            reply = operator.post(f"/jobs/{job_id}/cancel", data={"csrf": csrf_of(confirm), "confirm": "yes"})
            assert reply.status_code == 303
        ended = await client.wait_status("export_dataset", handle, "cancelled", "completed", timeout=30)
        assert ended["status"] == "cancelled"
    repo = JobRepository(store_url(server))
    try:
        job = repo.get(job_id)
        assert job is not None and job.cancel_requested_by == "operator:erin"
    finally:
        repo.dispose()


async def test_the_console_sees_both_nodes_of_a_deployment_and_steers_either(
    tmp_path: Path, pg_url: str, signing_key: str
) -> None:
    nodes = [
        HttpExampleServer(
            tmp_path / name, [signing_key], env={"HANDLES_DATABASE_URL": pg_url, "EXAMPLE_JOB_SECONDS": "60"}
        ).start()
        for name in ("a", "b")
    ]
    try:
        handles: list[str] = []
        for node in nodes:
            async with connect(node.url) as client:
                handle = str((await client.call("export_dataset_start", {"rows": 1000}))["handle"])
                await client.wait_status("export_dataset", handle, "working")
                handles.append(handle)
        ids = [job_id_of(handle, signing_key) for handle in handles]
        with console(pg_url, signed_in_as="hal") as operator:
            rows = {row["id"]: row for row in operator.get("/api/jobs").json()["jobs"]}
            assert set(rows) == set(ids)
            running_on = {rows[job_id]["node"] for job_id in ids}
            assert len(running_on) == 2, "each job shows the node that runs it"
            overview = operator.get("/overview").text
            assert all(
                f'<td class="mono">{node}</td><td class="num">1</td>' in overview for node in running_on
            )
            confirm = operator.get(f"/jobs/{ids[1]}/cancel").text
            operator.post(f"/jobs/{ids[1]}/cancel", data={"csrf": csrf_of(confirm), "confirm": "yes"})
        async with connect(nodes[1].url) as client:
            ended = await client.wait_status("export_dataset", handles[1], "cancelled", timeout=30)
            assert ended["status"] == "cancelled"
        async with connect(nodes[0].url) as client:
            other = await client.call("export_dataset_progress", {"handle": handles[0]})
            assert other["status"] == "working", "the other node's job goes on"
    finally:
        for node in nodes:
            node.stop()


async def test_mounted_in_the_server_an_answer_resumes_the_job_on_this_node(
    inprocess_example: InProcessExample,
) -> None:
    """Mounted with the server's `Handles`, the console hands the answered job to this node's runtime."""
    jobs = inprocess_example.jobs
    async with connect(inprocess_example.server) as client:
        handle = str((await client.call("deploy_release_start", {"version": "3.0.0"}))["handle"])
        job_id = job_id_of(handle, inprocess_example.key)
        await client.wait_status("deploy_release", handle, "input_required", timeout=60)
        transport = httpx2.ASGITransport(app=console_app(jobs, token=TOKEN))
        headers = {"Authorization": f"Bearer {TOKEN}", "X-Handles-Operator": "ops-bot"}
        async with httpx2.AsyncClient(
            transport=transport, base_url="http://console", headers=headers
        ) as http:
            reply = await http.post(
                f"/jobs/{job_id}/answer/q1", data={"approve": "true", "environment": "production"}
            )
            assert reply.status_code == 303, reply.text
        done = await client.wait_status("deploy_release", handle, "completed", timeout=60)
        assert done["status"] == "completed"
    question = get_input(jobs.service.store.repo, job_id, "q1")
    assert question is not None and question.answered_by == "operator:ops-bot"
