"""`handles check` against deliberately broken servers (tests/check/broken_server.py): each fails exactly
the gate it should, with evidence naming the request; `--list`, `--only` and `--skip` select gates."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from handles.check import GATES
from tests.check.support import BROKEN_JOBS, broken_server, check, handles_cli, verdicts
from tests.harness.process import REPO_ROOT, free_port
from tests.support import token_of


@pytest.mark.parametrize(
    ("fault", "gate", "request_shown"),
    [
        ("none", None, None),
        ("leak", "isolation", 'bob: tools/call slow_job_progress {"handle": "<the owner\'s handle>"} -> {'),
        ("duplicate", "duplicate", 'alice (a new connection): tools/call slow_job_start {"seconds": 1.0'),
        ("revive", "cancellation", "cancelled stays cancelled [alice: tools/call slow_job_progress"),
        ("list-leak", "isolation", "bob (2025-11-25): tasks/list -> {"),
        ("link-leak", "isolation", "bob: resources/read <the owner's result link> -> {"),
        (
            "unserved-tasks",
            "compatibility",
            "slow_job gives a task to a client of the 2025-11-25 design [alice (2025-11-25): tools/call slow_job",
        ),
        ("tasks-without-calls", None, None),
        ("chatty", "hygiene", "a sensitive value (18 characters) [alice: tools/call slow_job_progress"),
    ],
)
def test_a_broken_server_fails_exactly_its_gate(
    tmp_path: Path, fault: str, gate: str | None, request_shown: str | None
) -> None:
    with broken_server(tmp_path, fault) as server:
        done, report = check(tmp_path, server.url, BROKEN_JOBS)
    assert verdicts(report) == {name: name != gate for name in GATES}, done.stdout
    assert done.returncode == (0 if gate is None else 1)
    if gate is None:
        return
    failed = [line for line in report[list(GATES).index(gate)]["evidence"] if line.startswith("FAILED")]
    assert failed and request_shown in "\n".join(failed), failed
    assert f"{gate:<14} FAILED" in done.stdout
    junit = ET.parse(tmp_path / "report.xml").getroot()
    assert [case.get("name") for case in junit.iter("testcase") if case.find("failure") is not None] == [gate]


def test_the_stack_trace_and_path_in_an_error_are_named(tmp_path: Path) -> None:
    with broken_server(tmp_path, "chatty") as server:
        _, report = check(tmp_path, server.url, BROKEN_JOBS, "--only", "hygiene")
    failed = "\n".join(report[0]["evidence"])
    assert "a stack trace ('Traceback (most recent call last)')" in failed
    assert "an internal path ('/srv/jobs')" in failed
    assert 'alice: tools/call slow_job_progress {"handle": "<a made-up handle>"}' in failed


def test_list_only_and_skip_select_gates(tmp_path: Path) -> None:
    listed = handles_cli("check", "--list")
    assert [line.split()[0] for line in listed.stdout.splitlines()] == [*GATES, "load"]
    with broken_server(tmp_path, "leak") as server:
        done, report = check(
            tmp_path, server.url, BROKEN_JOBS, "--only", "isolation,duplicate", "--skip", "isolation"
        )
    assert done.returncode == 0, done.stdout + done.stderr
    assert verdicts(report) == {"duplicate": True}


def test_progress_is_one_rewritten_line_on_a_terminal_and_a_line_per_gate_otherwise(tmp_path: Path) -> None:
    (tmp_path / "checks.toml").write_text(BROKEN_JOBS)
    with broken_server(tmp_path, "none") as server:
        piped, _ = check(tmp_path, server.url, BROKEN_JOBS, "--only", "duplicate,hygiene")
        command = [
            sys.executable,
            "-m",
            "handles.cli",
            "check",
            server.url,
            "--jobs",
            str(tmp_path / "checks.toml"),
        ]
        command += [
            f"--as=alice={token_of('alice')}",
            f"--as=bob={token_of('bob')}",
            "--only",
            "duplicate,hygiene",
        ]
        terminal, reader = os.openpty()
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
        done = subprocess.run(
            command, stdout=subprocess.PIPE, stderr=reader, env=env, timeout=120, check=False
        )
        os.close(reader)
        shown = os.read(terminal, 65536).decode()
    assert "[1/2] duplicate...\n[2/2] hygiene...\n" in piped.stderr
    assert done.returncode == 0 and shown == "\r\x1b[K[1/2] duplicate...\r\x1b[K[2/2] hygiene...\r\x1b[K", (
        shown
    )


def test_a_wrong_checks_file_exits_2_and_an_unreachable_server_exits_3(tmp_path: Path) -> None:
    (tmp_path / "wrong.toml").write_text("[jobs.slow_job]\narguments = 3\n")
    principals = ["--as", "alice=a", "--as", "bob=b"]
    wrong = handles_cli(
        "check", "http://127.0.0.1:9/mcp", *principals, "--jobs", str(tmp_path / "wrong.toml")
    )
    assert (wrong.returncode, wrong.stdout) == (2, "")
    assert "[jobs.slow_job] arguments: Input should be a valid dictionary" in wrong.stderr
    assert "Traceback" not in wrong.stderr
    (tmp_path / "checks.toml").write_text(BROKEN_JOBS)
    gone = handles_cli(
        "check", f"http://127.0.0.1:{free_port()}/mcp", *principals, "--jobs", str(tmp_path / "checks.toml")
    )
    assert gone.returncode == 3, gone.stderr
    assert "handles check: could not read http://127.0.0.1:" in gone.stderr and "Traceback" not in gone.stderr


def test_the_load_gate_fails_a_server_that_starts_more_than_its_declared_limit(tmp_path: Path) -> None:
    load = "\n[load]\nstarts = 3\nlimit = 2\nseconds = 10\n"
    with broken_server(tmp_path, "none") as server:
        done, report = check(tmp_path, server.url, BROKEN_JOBS + load, "--only", "load")
    assert (done.returncode, verdicts(report)) == (1, {"load": False}), done.stdout
    failed = [line for line in report[0]["evidence"] if line.startswith("FAILED")]
    assert failed and all(
        line.startswith("FAILED: 3 started, the declared limit allowing 2 [") for line in failed
    )
    assert "[alice: tools/call slow_job_start" in failed[0] and "[bob: tools/call slow_job_start" in failed[1]


def test_what_a_hostile_server_says_reaches_the_terminal_as_plain_text(tmp_path: Path) -> None:
    with broken_server(tmp_path, "escapes") as server:
        checked, _ = check(tmp_path, server.url, BROKEN_JOBS, "--verbose")
        shown = handles_cli("manifest", server.url, "--token", token_of("alice"))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("server    broken-jobs ")
    for printed in (checked.stdout, checked.stderr, shown.stdout, shown.stderr):
        assert "\x1b" not in printed and "\x07" not in printed, printed
