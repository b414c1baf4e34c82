"""What the `handles check` tests share: the checks files and one run of the command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.harness.process import REPO_ROOT, ServerProcess, free_port, python_module, server_env
from tests.support import TOKENS, token_of

EXAMPLE_JOBS = """
sensitive_values = ["never-shown-anywhere"]

[jobs.generate_report]
arguments = { account = "acme-private-account", months = 2 }
cancel = true
sensitive = ["account"]

[jobs.deploy_release]
arguments = { version = "3.0.0" }
answer = { approve = true, environment = "staging" }
cancel = true

[jobs.export_dataset]
arguments = { rows = 100 }
cancel = true
"""

BROKEN_JOBS = """
[jobs.slow_job]
arguments = { seconds = 1.0, note = "private-note-value" }
cancel = true
sensitive = ["note"]
"""


def handles_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`handles ARGS` as a subprocess of this interpreter, importing this checkout (in `env` when given)."""
    command = [sys.executable, "-m", "handles.cli", *args]
    env = env or dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


def check(tmp: Path, url: str, jobs: str, *options: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    """Run `handles check URL` as alice and bob; the process and its `--json` report."""
    (tmp / "checks.toml").write_text(jobs)
    report, principals = (
        tmp / "report.json",
        [f"--as=alice={token_of('alice')}", f"--as=bob={token_of('bob')}"],
    )
    files = ["--jobs", str(tmp / "checks.toml"), "--json", str(report), "--junit", str(tmp / "report.xml")]
    done = handles_cli("check", url, *principals, *files, *options)
    return done, json.loads(report.read_text()) if report.exists() else None


@contextmanager
def broken_server(tmp: Path, fault: str) -> Iterator[ServerProcess]:
    """tests/check/broken_server.py with `fault`, over Streamable HTTP with the two tokens of `TOKENS`."""
    (tmp / "tokens.json").write_text(json.dumps(TOKENS))
    port = free_port()
    command = python_module("tests.check.broken_server", "--port", str(port))
    command += ["--tokens", str(tmp / "tokens.json"), "--fault", fault]
    with ServerProcess(command, server_env(tmp), tmp / "server.log", port, ready="http").running() as server:
        yield server


def verdicts(report: list[dict[str, Any]]) -> dict[str, bool]:
    return {entry["name"]: entry["passed"] for entry in report}
