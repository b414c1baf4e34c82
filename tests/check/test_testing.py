"""`handles.testing`: the gates as test cases of an author's own suite, against the example server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from handles.testing import assert_gates
from tests.check.support import BROKEN_JOBS, EXAMPLE_JOBS, broken_server
from tests.harness.process import REPO_ROOT
from tests.support import TOKENS, HttpExampleServer, example_env, token_of

PRINCIPALS = [("alice", token_of("alice")), ("bob", token_of("bob"))]


def _pytest(suite: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """An author's suite in `suite` run by pytest in a process of its own."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-rA"]
    return subprocess.run(
        [*command, str(suite / "test_my_server.py")],
        capture_output=True,
        text=True,
        cwd=suite,
        env=env | {"PYTHONPATH": str(REPO_ROOT)},
        timeout=300,
    )


def test_one_line_in_a_suite_gives_one_passing_case_per_gate(
    tmp_path: Path, http_auth_example: HttpExampleServer
) -> None:
    (tmp_path / "checks.toml").write_text(EXAMPLE_JOBS)
    (tmp_path / "test_my_server.py").write_text(
        "from handles.testing import gate_tests\n"
        f"test_gates = gate_tests({http_auth_example.url!r}, {PRINCIPALS!r}, {str(tmp_path / 'checks.toml')!r},"
        " only=['isolation', 'duplicate'])\n"
    )
    done = _pytest(tmp_path, dict(os.environ))
    assert done.returncode == 0, done.stdout[-3000:]
    assert "PASSED test_my_server.py::test_gates[isolation]" in done.stdout
    assert "PASSED test_my_server.py::test_gates[duplicate]" in done.stdout
    assert "2 passed" in done.stdout


IN_PROCESS_SUITE = """
from mcp.server.auth.settings import AuthSettings

from example_server.__main__ import FileTokenVerifier
from example_server.server import build_server, create_jobs
from handles.testing import gate_tests

jobs = create_jobs()
server = build_server(
    jobs,
    token_verifier=FileTokenVerifier({tokens!r}),
    auth=AuthSettings(issuer_url="http://127.0.0.1", resource_server_url=None, validate_token_resource=False),
)
test_gates = gate_tests(server, {principals!r}, "checks.toml", only=["isolation", "duplicate"], handles=jobs)
"""


def test_a_server_built_in_the_suite_is_checked_in_process_over_http(tmp_path: Path) -> None:
    (tmp_path / "checks.toml").write_text(EXAMPLE_JOBS)
    (tmp_path / "test_my_server.py").write_text(IN_PROCESS_SUITE.format(tokens=TOKENS, principals=PRINCIPALS))
    done = _pytest(tmp_path, example_env(tmp_path / "data", ["in-process-key-" + "k" * 32]))
    assert done.returncode == 0, done.stdout[-3000:]
    assert "PASSED test_my_server.py::test_gates[isolation]" in done.stdout
    assert "PASSED test_my_server.py::test_gates[duplicate]" in done.stdout


def test_a_failing_gate_fails_the_test_with_its_evidence(tmp_path: Path) -> None:
    (tmp_path / "checks.toml").write_text(BROKEN_JOBS)
    with broken_server(tmp_path, "duplicate") as server, pytest.raises(AssertionError) as failed:
        assert_gates(server.url, PRINCIPALS, tmp_path / "checks.toml", only=["duplicate", "hygiene"])
    assert str(failed.value).startswith("duplicate:\n")
    assert (
        "FAILED: slow_job: dropped after the start's reply, started twice more with its key: one job"
        in str(failed.value)
    )
    assert "hygiene" not in str(failed.value)
