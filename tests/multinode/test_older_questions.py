"""The 2025-11-25 design's questions on two nodes of one PostgreSQL database: a question asked on one
node's `tasks/result` stream is answered on the other, and one asked before its node restarts is
answered on the restarted node; on the raw wire, and by the three real clients of that design
(tests/interop/test_older_task_clients.py), each through its elicitation handler."""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.interop.test_older_task_clients import OLDER_CLIENTS, OWNER, client_env, older_client, run_client
from tests.support import FRAMEWORKS, framework_args
from tests.tasks.wire import older_result_frames, post_answer

from .conftest import Cluster

pytestmark = pytest.mark.timeout(180)
APPROVAL = {"action": "accept", "content": {"approve": True, "environment": "production"}}
RELATED = "io.modelcontextprotocol/related-task"


async def start_deploy(http: httpx2.AsyncClient, url: str, version: str) -> str:
    call = {"name": "deploy_release", "arguments": {"version": version}, "task": {"ttl": 60000}}
    request = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call}
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
    response = await http.post(url, json=request, headers=headers)
    frames = [line for line in response.text.splitlines() if line.startswith("data:")]
    task_id: str = json.loads(frames[-1][5:])["result"]["task"]["taskId"]
    return task_id


async def first_question(http: httpx2.AsyncClient, url: str, task_id: str) -> dict[str, Any]:
    """Open `tasks/result` on `url` and close it once the job's question arrives."""
    async with contextlib.aclosing(older_result_frames(http, url, task_id)) as frames:
        async for frame in frames:
            if frame.get("method") == "elicitation/create":
                return frame
    raise AssertionError("the stream ended without a question")


def test_a_question_asked_on_one_node_is_answered_on_the_other_and_across_a_restart(cluster: Cluster) -> None:
    # Node a runs no job and polls the store only every 30 s: its stream hears b's changes through NOTIFY.
    a = cluster.server("a", HANDLES_RUN_WORKERS="0", HANDLES_STORE_POLL_SECONDS="30", EXAMPLE_JOB_SECONDS="1")
    b = cluster.server("b", EXAMPLE_JOB_SECONDS="1")

    async def main() -> None:
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=60)) as http:
            task_id = await start_deploy(http, a.url, "5.0.0")
            statuses: list[str] = []
            final: dict[str, Any] = {}
            async with contextlib.aclosing(older_result_frames(http, a.url, task_id)) as frames:
                async for frame in frames:
                    if frame.get("method") == "elicitation/create":
                        assert await post_answer(http, b.url, frame["id"], APPROVAL) == 202
                    elif frame.get("method") == "notifications/tasks/status":
                        statuses.append(frame["params"]["status"])
                    else:
                        final = frame
                        break
            assert final["result"]["structuredContent"]["environment"] == "production", final
            assert statuses[-1] == "completed" and "input_required" in statuses, statuses

            # Asked on a, which restarts before the answer comes; answered on the new a, read on b.
            task_id = await start_deploy(http, a.url, "5.0.1")
            question = await first_question(http, a.url, task_id)
            a.stop()
            a.start()
            assert await post_answer(http, a.url, question["id"], APPROVAL) == 202
            async with contextlib.aclosing(older_result_frames(http, b.url, task_id)) as frames:
                async for frame in frames:
                    if "result" in frame or "error" in frame:
                        final = frame
                        break
            assert final["result"]["structuredContent"]["version"] == "5.0.1", final

    asyncio.run(main())


def assert_answered(seen: dict[str, Any], task_id: str) -> None:
    """The client was asked the deployment's question, related to `task_id`, once, and its answer is in
    the task's result."""
    [asked] = seen["asked"]
    assert asked["_meta"][RELATED] == {"taskId": task_id}, asked
    assert asked["message"].startswith("Release 8.0.0 is built"), asked
    result = seen["result"]
    assert result["structuredContent"]["environment"] == "production", result
    assert result["structuredContent"]["version"] == "8.0.0", result
    assert result["_meta"][RELATED] == {"taskId": task_id}, result


@contextlib.contextmanager
def holding(command: list[str], env: dict[str, str], log: Path) -> Iterator[dict[str, Any]]:
    """A client run with `--hold`: what it saw once asked, while it lives with the question open; its
    errors in `log`."""
    with (
        log.open("w") as errors,
        subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=errors, text=True, env=client_env(**env)
        ) as client,
    ):
        assert client.stdout is not None
        try:
            ready, _, _ = select.select([client.stdout], [], [], 60)
            line = client.stdout.readline() if ready else ""
            assert line, f"the client was not asked:\n{log.read_text()[-4000:]}"
            yield json.loads(line)
        finally:
            client.kill()


@pytest.mark.timeout(600)  # a first run creates the client's environment
@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("client", OLDER_CLIENTS)
def test_a_real_client_answers_on_one_node_a_question_of_a_job_created_on_the_other_and_across_a_restart(
    cluster: Cluster, tmp_path: Path, client: str, framework: str
) -> None:
    command, env = older_client(client)
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({OWNER: "older-owner"}))
    node = ("--tokens", str(tokens), *framework_args(framework))
    # Node a runs the jobs; b runs none and polls the store only every 30 s: it hears of a's changes through NOTIFY.
    a = cluster.server("a", *node, EXAMPLE_JOB_SECONDS="1")
    serving = {"HANDLES_RUN_WORKERS": "0", "HANDLES_STORE_POLL_SECONDS": "30", "EXAMPLE_JOB_SECONDS": "1"}
    b = cluster.server("b", *node, **serving)

    def across(url: str, origin: str) -> dict[str, Any]:
        """Within b's store poll: b's stream learns of a's question and the job's end through NOTIFY."""
        return run_client(command, "--nodes", OWNER, url, origin, timeout=25, **env)

    # Created through a; a new session with b reads the question through tasks/result and answers it.
    seen = across(b.url, a.url)
    assert_answered(seen, seen["taskId"])

    # Created through b, asked through a, which restarts (SIGTERM) while the client holds the question
    # unanswered: a new session with the new a reads the same question again and answers it.
    hold = [*command, "--nodes", OWNER, a.url, b.url, "--hold"]
    with holding(hold, env, tmp_path / "holding.log") as held:
        [asked] = held["asked"]
        assert asked["_meta"][RELATED] == {"taskId": held["taskId"]}, asked
        a.stop()
        a.start()
    seen = across(a.url, held["taskId"])
    assert_answered(seen, held["taskId"])
