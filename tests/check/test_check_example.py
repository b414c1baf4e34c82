"""`handles check` through its real entry point against the example server over Streamable HTTP, with two
bearer tokens: it passes every gate, on the SDK's `MCPServer` and on FastMCP 4, in both tool layouts."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from handles.check import GATES
from tests.check.support import EXAMPLE_JOBS, check, verdicts
from tests.support import TOKENS, HttpExampleServer


@pytest.mark.timeout(300)  # every gate, each job followed to its end at least once
@pytest.mark.parametrize("served", ["http_auth_example", "fastmcp_http_auth_example"])
def test_the_example_server_passes_every_gate(
    tmp_path: Path, served: str, request: pytest.FixtureRequest
) -> None:
    server: HttpExampleServer = request.getfixturevalue(served)
    done, report = check(tmp_path, server.url, EXAMPLE_JOBS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert verdicts(report) == dict.fromkeys(GATES, True)
    assert all(entry["applied"] for entry in report), report
    evidence = {entry["name"]: "\n".join(entry["evidence"]) for entry in report}
    # Bob tried every handle tool and every Tasks method on alice's job and task, and was told nothing more.
    for request in (
        'bob: tools/call deploy_release_respond {"handle": "<the owner\'s handle>"',
        'bob: tools/call generate_report_cancel {"handle": "<the owner\'s handle>"}',
        "bob: tasks/update <the owner's task id>",
        "bob: tasks/cancel <an altered task id>",
        "bob (2025-11-25): tasks/result <the owner's task id>",
        "ok: another principal's tasks/list shows none of the owner's [bob (2025-11-25): tasks/list]",
        # A fetch's result link is read by its owner only; bob's listen for alice's task is pushed nothing.
        "ok: the owner reads its result link [alice: resources/read <the owner's result link>]",
        "ok: answers like a made-up result link [bob: resources/read <the owner's result link>]",
        "ok: answers like a made-up result link [bob: resources/read <an altered result link>]",
        "the server pushes the owner's task status to the owner [alice: subscriptions/listen <the owner's task id>",
        "ok: pushes nothing it would not push for a made-up task id [bob: subscriptions/listen <the owner's task id>",
    ):
        assert request in evidence["isolation"]
    assert "FAILED" not in evidence["isolation"]
    assert (
        "ok: deploy_release moved working -> input_required -> working -> completed"
        in evidence["transitions"]
    )
    # The 2025-11-25 design: the question answered on the tasks/result stream, an ended task's cancel refused.
    assert "ok: deploy_release's task moved working -> input_required -> completed" in evidence["transitions"]
    assert "ok: tasks/cancel after the end is -32602 [alice (2025-11-25)" in evidence["transitions"]
    assert "ok: deploy_release gives a task to a client of the 2025-11-25 design" in evidence["compatibility"]
    for dropped in ("before", "after"):  # the start retried on a new connection: one job, followed to its end
        claim = f"ok: deploy_release: dropped {dropped} the start's reply, started twice more with its key: one job"
        assert claim in evidence["duplicate"]
    assert "ok: deploy_release: resumed on a new connection, no start" in evidence["duplicate"]
    assert "alice (no Tasks extension): tools/call deploy_release_start" in evidence["compatibility"]
    suite = ET.parse(tmp_path / "report.xml").getroot()
    assert (suite.get("tests"), suite.get("failures")) == (str(len(GATES)), "0")


@pytest.fixture
def compact_auth_example(tmp_path: Path, signing_key: str) -> Iterator[HttpExampleServer]:
    with HttpExampleServer(tmp_path / "compact", [signing_key], TOKENS, layout="compact").running() as server:
        yield server


def test_the_compact_layout_is_discovered_and_checked(
    tmp_path: Path, compact_auth_example: HttpExampleServer
) -> None:
    done, report = check(tmp_path, compact_auth_example.url, EXAMPLE_JOBS, "--only", "isolation,transitions")
    assert done.returncode == 0, done.stdout + done.stderr
    assert verdicts(report) == {"isolation": True, "transitions": True}
    isolation = "\n".join(report[0]["evidence"])
    assert "bob: tools/call jobs_respond" in isolation and "bob: tools/call jobs_cancel" in isolation


LOAD = """
[load]
job = "generate_report"
starts = 3
limit = 2
seconds = 20
"""


def test_the_opt_in_load_gate_holds_the_example_to_its_declared_limit(
    tmp_path: Path, signing_key: str
) -> None:
    limited = HttpExampleServer(
        tmp_path / "limited", [signing_key], TOKENS, env={"HANDLES_MAX_ACTIVE_PER_PRINCIPAL": "2"}
    )
    with limited.running() as server:
        done, report = check(tmp_path, server.url, EXAMPLE_JOBS + LOAD, "--only", "load")
    assert done.returncode == 0, done.stdout + done.stderr
    assert verdicts(report) == {"load": True}
    evidence = "\n".join(report[0]["evidence"])
    for name in (
        "alice",
        "bob",
    ):  # each principal: two of three concurrent starts, the third refused as documented
        assert f"ok: {name}: 3 concurrent starts of generate_report answered within 20 s" in evidence
        assert (
            f"ok: the start over the limit is refused with limit_reached [{name}: tools/call generate_report_start"
            in evidence
        )
    assert evidence.count("ok: 2 started, the declared limit allowing 2") == 2
    assert evidence.count("ok: generate_report ended after ") == 4, evidence
    assert "clean-up not checked: [load] sets no retention the gate may wait" in evidence
