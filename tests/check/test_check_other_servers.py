"""`handles check` beyond Streamable HTTP on a `handles` server: the example over stdio (one principal),
and the FastMCP 4 + fastmcp-tasks peer (bench/.peer-venv), a server not built on `handles`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench.common import BENCH_DIR
from handles.check import GATES
from tests.check.support import EXAMPLE_JOBS, check, handles_cli, verdicts
from tests.harness.process import ServerProcess, free_port
from tests.support import TOKENS, example_env

pytestmark = pytest.mark.timeout(420)  # the first run creates the peer's virtual environment

PEER_JOBS = """
[jobs.work]
arguments = { seconds = 1.0, mark = "private-mark" }
cancel = true
sensitive = ["mark"]
"""


def test_the_example_over_stdio_passes_every_gate(tmp_path: Path, signing_key: str) -> None:
    (tmp_path / "checks.toml").write_text(EXAMPLE_JOBS)
    report = tmp_path / "report.json"
    env = example_env(tmp_path, [signing_key])
    server = [sys.executable, "-m", "example_server"]
    done = handles_cli(
        "check",
        "--stdio",
        "--jobs",
        str(tmp_path / "checks.toml"),
        "--json",
        str(report),
        "--",
        *server,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    entries = json.loads(report.read_text())
    assert verdicts(entries) == dict.fromkeys(GATES, True)
    isolation = "\n".join(entries[0]["evidence"])
    assert "one principal only" in isolation and "local: tools/call generate_report_progress" in isolation


@pytest.mark.parametrize("tokens", [True, False], ids=["bearer-tokens", "no-authentication"])
def test_the_fastmcp_tasks_peer(tmp_path: Path, peer_python: str, tokens: bool) -> None:
    (tmp_path / "tokens.json").write_text(json.dumps(TOKENS))
    port = free_port()
    command = [peer_python, str(BENCH_DIR / "peer_server.py"), "--port", str(port)]
    command += ["--tokens", str(tmp_path / "tokens.json")] if tokens else []
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    with ServerProcess(command, env, tmp_path / "peer.log", port, start_timeout=60).running() as server:
        done, report = check(tmp_path, server.url, PEER_JOBS)
    # Duplicate finds nothing to test: the peer has no start tool, so no idempotency key.
    applied = {entry["name"]: entry["applied"] for entry in report}
    assert applied == {name: name != "duplicate" for name in GATES}, done.stdout
    # Without authentication every caller is the same to the peer: its task ids are bearer capabilities.
    assert verdicts(report) == {**dict.fromkeys(GATES, True), "isolation": tokens}, done.stdout
    if not tokens:
        assert (
            "FAILED: answers like a made-up task id [bob: tasks/get <the owner's task id> ->" in done.stdout
        )
