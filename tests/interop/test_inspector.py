"""The example server as shipped, driven by the MCP Inspector's own command-line clients (tests/interop/inspector.py).

The example runs as a subprocess over Streamable HTTP with bearer tokens, on the SDK's `MCPServer` and on
FastMCP 4. `mcp-inspector --cli` makes each call from a new process on a new connection (a handshake-era
client, the Inspector's default), so a job followed by its handle is followed across connections, as a
model's client does. `mcpdo`, connected in the 2026-07-28 era, declares the Tasks extension: it is given a
task, polls it with `tasks/get`, and answers the task's question with `tasks/update`. A relay in front of
the server records the head of every request, so the tests see which methods the Inspector sent.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.relay import Relay
from tests.interop.inspector import Inspector
from tests.support import FRAMEWORKS, REPO_ROOT, HttpExampleServer, framework_args, new_key
from tests.tasks.wire import example_on_each_framework

pytestmark = pytest.mark.timeout(300)  # a first run installs the Inspector (about 15 s)

TOKENS = {"inspector-alice-token-2f9a": "alice", "inspector-bob-token-7c1e": "bob"}
ALICE, BOB = list(TOKENS)
GENERATED = {
    f"{job}{suffix}"
    for job in ("deploy_release", "export_dataset", "generate_report")
    for suffix in (
        "_start",
        "_progress",
        "_fetch",
        "_cancel",
        *(["_respond"] if job == "deploy_release" else []),
    )
}


example = example_on_each_framework("example-inspector", TOKENS)


@pytest.fixture
def inspector(tmp_path: Path) -> Iterator[Inspector]:
    client = Inspector(tmp_path / "inspector")
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def relay(example: HttpExampleServer) -> Iterator[Relay]:
    """A relay in front of the example that records every request's head (a test asks for it before the
    Inspector, so the Inspector's daemon and its connections are gone before the relay closes)."""
    relayed = Relay(example.port).up()
    try:
        yield relayed
    finally:
        relayed.close()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def call(inspector: Inspector, url: str, token: str, tool: str, *arguments: str) -> dict[str, Any]:
    """`tools/call` of `tool` by a new Inspector process (`name=value` arguments): the tool's result."""
    printed = inspector.cli(
        url, "--method", "tools/call", "--tool-name", tool, "--tool-arg", *arguments, headers=bearer(token)
    )
    assert "result" in printed, printed
    result: dict[str, Any] = printed["result"]
    return result


def methods_sent(relay: Relay) -> list[str]:
    """The `Mcp-Method` header of each request the relay has seen, in order (2026-07-28 requests carry it)."""
    sent = []
    for head in relay.stats.requests:
        for line in head.decode(errors="replace").split("\r\n"):
            name, _, value = line.partition(":")
            if name.strip().lower() == "mcp-method":
                sent.append(value.strip())
    return sent


def connect(inspector: Inspector, name: str, url: str, token: str, era: str) -> None:
    connected = inspector.mcpdo(
        "connect", url, "--era", era, "--connection", name, "--header", f"Authorization: Bearer {token}"
    )
    assert "error" not in connected, connected


def test_the_inspector_cli_follows_a_job_by_its_handle_with_a_new_connection_for_each_call(
    example: HttpExampleServer, inspector: Inspector
) -> None:
    listed = inspector.cli(example.url, "--method", "tools/list", headers=bearer(ALICE))
    tools = {tool["name"]: tool for tool in listed["result"]["tools"]}
    assert set(tools) >= GENERATED
    assert "outputSchema" in tools["generate_report_progress"]

    started = call(inspector, example.url, ALICE, "generate_report_start", "account=acme", "months=2")
    assert not started.get("isError"), started
    start = started["structuredContent"]
    assert start["status"] == "working" and start["created"] is True
    assert "generate_report_progress" in start["next"]

    progress = call(inspector, example.url, ALICE, "generate_report_progress", f"handle={start['handle']}")
    assert not progress.get("isError"), progress
    assert progress["structuredContent"]["status"] in ("working", "completed")
    assert progress["structuredContent"]["next"]

    fetched = call(
        inspector, example.url, ALICE, "generate_report_fetch", f"handle={start['handle']}", "wait_seconds=30"
    )
    done = fetched["structuredContent"]
    assert done["status"] == "completed", done
    assert done["result"]["months"] == 2 and len(done["result"]["revenue_by_month"]) == 2
    assert done["result"]["total_revenue"] == pytest.approx(sum(done["result"]["revenue_by_month"]))


def test_the_inspector_cli_finds_no_error_in_the_tool_schemas(
    example: HttpExampleServer, inspector: Inspector
) -> None:
    """The Inspector's schema portability check (`--strict`) exits 6 on an error-severity problem. The
    output schemas write optional values as type lists (`["string", "null"]`, handles.server.output_schema),
    which it reports as warnings only."""
    linted = inspector.cli_process(example.url, "--method", "tools/list", "--strict", headers=bearer(ALICE))
    assert linted.returncode == 0, linted.stderr[-3000:]
    assert "inputSchema" not in linted.stderr, linted.stderr[-3000:]


def test_another_principal_s_handle_reads_to_the_inspector_as_a_made_up_one(
    example: HttpExampleServer, inspector: Inspector
) -> None:
    started = call(inspector, example.url, ALICE, "generate_report_start", "account=initech", "months=1")
    handle = started["structuredContent"]["handle"]
    made_up = handle[:-4] + ("AAAA" if not handle.endswith("AAAA") else "BBBB")

    by_bob = call(inspector, example.url, BOB, "generate_report_progress", f"handle={handle}")
    invented = call(inspector, example.url, BOB, "generate_report_progress", f"handle={made_up}")
    assert by_bob["isError"] is True and invented["isError"] is True
    assert by_bob["content"] == invented["content"]
    assert "unknown_handle" in by_bob["content"][0]["text"]
    assert "structuredContent" not in by_bob or by_bob["structuredContent"] == invented["structuredContent"]

    own = call(inspector, example.url, ALICE, "generate_report_fetch", f"handle={handle}", "wait_seconds=30")
    assert own["structuredContent"]["status"] == "completed"


def test_the_inspector_in_the_2026_era_is_given_a_task_and_polls_it_to_the_result(
    example: HttpExampleServer, relay: Relay, inspector: Inspector
) -> None:
    connect(inspector, "modern", relay.url, ALICE, "modern")
    result = inspector.mcpdo(
        "--connection", "modern", "tools/call", "generate_report", 'account:="acme"', "months:=3"
    )
    assert result.get("isError") is False, result
    assert result["structuredContent"]["months"] == 3
    sent = methods_sent(relay)
    assert "tools/call" in sent and "tasks/get" in sent[sent.index("tools/call") :], sent

    # A handshake-era connection asking for a task (`--task`, the 2025-11-25 design) is given one, and follows
    # it (`tasks/get`, `tasks/result`, which carry no Mcp-Method header) to the same result.
    connect(inspector, "legacy", relay.url, ALICE, "legacy")
    legacy = inspector.mcpdo(
        "--connection", "legacy", "tools/call", "--task", "generate_report", 'account:="acme"', "months:=3"
    )
    assert legacy["structuredContent"] == result["structuredContent"]


def test_the_inspector_answers_a_task_s_question_with_tasks_update(
    example: HttpExampleServer, relay: Relay, inspector: Inspector
) -> None:
    connect(inspector, "modern", relay.url, ALICE, "modern")
    asked = inspector.mcpdo("--connection", "modern", "tools/call", "deploy_release", 'version:="2.0.1"')
    pending = asked["elicitationPending"]
    assert pending["origin"] == "task-input-required", pending
    assert "Release 2.0.1" in pending["message"]
    assert set(pending["requestedSchema"]["properties"]) == {"approve", "environment"}

    answered = inspector.mcpdo(
        "--connection",
        "modern",
        "elicitation/respond",
        pending["elicitationId"],
        "approve:=true",
        'environment:="staging"',
    )
    assert answered.get("isError") is False, answered
    deployed = answered["structuredContent"]
    assert deployed["version"] == "2.0.1" and deployed["environment"] == "staging"
    assert len(deployed["steps"]) == 6
    sent = methods_sent(relay)
    assert sent.index("tools/call") < sent.index("tasks/update") < len(sent) - 1, sent
    assert sent[-1] == "tasks/get", sent


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_job_started_by_one_inspector_session_over_stdio_is_finished_by_the_next(
    tmp_path: Path, inspector: Inspector, framework: str
) -> None:
    """Over stdio each Inspector command starts the server and ends it as it exits (stdin closed, SIGTERM
    2 s later): the job it started is handed over then, and the next command's server runs it at once."""
    server = [sys.executable, "-m", "example_server", *framework_args(framework)]
    env = {
        "HANDLES_SECRET_KEYS": new_key(),
        "HANDLES_DATA_DIR": str(tmp_path / "data"),
        "EXAMPLE_JOB_SECONDS": "3",
        "PYTHONPATH": str(REPO_ROOT),
    }
    started = inspector.cli(
        server, "--method", "tools/call", "--tool-name", "generate_report_start", "--tool-arg", "account=acme",
        "months=2", env=env,
    )  # fmt: skip
    handle = started["result"]["structuredContent"]["handle"]
    fetched = inspector.cli(
        server, "--method", "tools/call", "--tool-name", "generate_report_fetch", "--tool-arg", f"handle={handle}",
        "wait_seconds=20", env=env,
    )  # fmt: skip
    done = fetched["result"]["structuredContent"]
    assert done["status"] == "completed", done
    assert done["result"]["months"] == 2


def test_the_inspector_reads_a_task_s_result_file_through_its_link(
    example: HttpExampleServer, inspector: Inspector
) -> None:
    """An export's CSV comes back as a link (a `resource_link` block and `_meta`), which the Inspector reads
    with `resources/read` on a connection of its own; to another principal the link names nothing."""
    connect(inspector, "modern", example.url, ALICE, "modern")
    exported = inspector.mcpdo("--connection", "modern", "tools/call", "export_dataset", "rows:=50")
    links = [block for block in exported["content"] if block["type"] == "resource_link"]
    assert len(links) == 1 and links[0]["mimeType"] == "text/csv", exported
    uri = links[0]["uri"]

    read = inspector.cli(example.url, "--method", "resources/read", "--uri", uri, headers=bearer(ALICE))
    (contents,) = read["result"]["contents"]
    lines = contents["text"].splitlines()
    assert lines[0] == "id,account,amount,day" and len(lines) == 51
    assert hashlib.sha256(contents["text"].encode()).hexdigest() == contents["_meta"]["sha256"]

    by_bob = inspector.cli(example.url, "--method", "resources/read", "--uri", uri, headers=bearer(BOB))
    invented = inspector.cli(
        example.url, "--method", "resources/read", "--uri", uri[:-4] + "0000", headers=bearer(BOB)
    )
    assert "error" in by_bob and "error" in invented, (by_bob, invented)
    assert by_bob["error"]["message"] == invented["error"]["message"].replace(uri[:-4] + "0000", uri)
