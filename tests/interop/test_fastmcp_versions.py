"""The FastMCP binding on the oldest FastMCP 4 that installs here, and beside `fastmcp-tasks` on one server.

The project's own environment holds the newest FastMCP 4 (pinned in pyproject.toml's `dev` extra); every
test that runs the example with `--fastmcp` runs on it. Here two more virtual environments, each created
once and then reused, run tests/interop/fastmcp_server_check.py:

- tests/interop/.venv-fastmcp-oldest: FastMCP `FASTMCP_OLDEST` and this project;
- bench/.peer-venv (the benchmark's peer): `fastmcp-tasks` 4.1.4, which pins FastMCP 4.1.4, and this
  project: a server with fastmcp-tasks' extension refuses a second Tasks face, and with
  `bind(server, tasks=False)` both serve side by side.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bench.peer import PEER_PROBE, PEER_REQUIREMENT, PEER_VENV, ensure_venv
from tests.support import REPO_ROOT

pytestmark = pytest.mark.timeout(600)  # a first run creates the virtual environments (about a minute each)

FASTMCP_OLDEST = "4.0.0"
"""The oldest FastMCP 4 release; `mcp-handles[fastmcp]` accepts `fastmcp>=4.0,<5`."""
OLDEST_VENV = Path(__file__).with_name(".venv-fastmcp-oldest")
CHECK = Path(__file__).with_name("fastmcp_server_check.py")
GENERATED = [
    f"{job}{suffix}"
    for job in ("deploy_release", "export_dataset", "generate_report")
    for suffix in (
        "",
        "_cancel",
        "_fetch",
        "_progress",
        *(["_respond"] if job == "deploy_release" else []),
        "_start",
    )
]


def prepared(venv: Path, requirements: list[str], probe: str) -> Path:
    problem = ensure_venv(venv, requirements, probe, timeout=420)
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"FastMCP versions: {problem}")
        pytest.skip(f"FastMCP versions: {problem}")
    return venv / "bin" / "python"


def run_check(python: Path, data_dir: Path) -> dict[str, Any]:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(REPO_ROOT),  # the example server: the editable install maps `handles` only
        "HANDLES_DATA_DIR": str(data_dir),
        "HANDLES_SECRET_KEYS": secrets.token_urlsafe(48),
        "EXAMPLE_JOB_SECONDS": "0.5",
    }
    done = subprocess.run(
        [str(python), str(CHECK)], capture_output=True, text=True, timeout=240, env=env, cwd=REPO_ROOT
    )
    assert done.returncode == 0, f"the FastMCP check failed:\n{done.stderr[-4000:]}"
    seen: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return seen


def assert_jobs_served(seen: dict[str, Any], prefix: str = "") -> None:
    """The job's handle tools, its plain tool, a mistake and a made-up handle answered as on MCPServer."""
    fetched = seen[f"{prefix}fetched"]
    assert fetched["status"] == "completed" and fetched["result"]["months"] == 2
    assert seen[f"{prefix}plain"]["account"] == "globex"
    assert seen[f"{prefix}mistake"]["error"] == "invalid_arguments"
    assert "monthz" in seen[f"{prefix}mistake"]["message"]
    assert seen[f"{prefix}made_up"]["error"] == "unknown_handle"


def test_the_oldest_fastmcp_4_serves_the_jobs(tmp_path: Path) -> None:
    python = prepared(
        OLDEST_VENV,
        [f"fastmcp=={FASTMCP_OLDEST}", "-e", str(REPO_ROOT)],
        f"import handles; from importlib.metadata import version; "
        f"assert version('fastmcp-slim') == {FASTMCP_OLDEST!r}",
    )
    seen = run_check(python, tmp_path)
    assert seen["fastmcp"] == FASTMCP_OLDEST
    assert seen["tools"] == sorted([*GENERATED, "lookup_account"])
    assert_jobs_served(seen)


def test_fastmcp_tasks_and_the_jobs_share_a_server_only_without_a_second_tasks_face(tmp_path: Path) -> None:
    python = prepared(
        PEER_VENV, [PEER_REQUIREMENT, "uvicorn", "-e", str(REPO_ROOT)], PEER_PROBE + ", handles"
    )
    seen = run_check(python, tmp_path)
    assert seen["fastmcp_tasks"] == "4.1.4"
    assert_jobs_served(seen)
    refused = seen["refused"]
    assert refused is not None and "already serves the io.modelcontextprotocol/tasks extension" in refused
    assert "jobs.bind(server, tasks=False)" in refused
    assert seen["side_task_id"], "fastmcp-tasks made its task=True tool a task"
    assert seen["side_task"] == {"result": 5}
    assert_jobs_served(seen, "side_")
