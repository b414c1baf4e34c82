"""What the start-up tests share: running a command to its end, and checking it failed in one clean line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
from sqlalchemy import create_engine

from handles.store import migrate
from tests.support import REPO_ROOT

UNREACHABLE_URL = "postgresql+psycopg://handles:s3cret-pw@127.0.0.1:9/none"
"""PostgreSQL on a port nothing listens on (the discard port); the password must never be printed."""


def example_server(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`python -m example_server ARGS` run to its end (stdin closed)."""
    return subprocess.run(
        [sys.executable, "-m", "example_server", *args],
        env=env,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_program(folder: Path, source: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`source` saved as `folder/program.py` and run as `python program.py` in `folder` (stdin closed), as a
    reader runs a program of their own: this repository importable, no HANDLES_* setting or warning filter
    from the test's environment, its data under `folder/data`, then `env`."""
    script = folder / "program.py"
    script.write_text(source)
    environment = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("HANDLES_") and k not in ("PYTHONWARNINGS", "PYTHONPATH")
    }
    environment.update(PYTHONPATH=str(REPO_ROOT), HANDLES_DATA_DIR=str(folder / "data"), **env)
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=folder,
        env=environment,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_one_line_failure(done: subprocess.CompletedProcess[str], prefix: str, *phrases: str) -> str:
    """Exit code 2 and exactly one line on stderr, `prefix: ...` with each of `phrases`; no traceback."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, f"exit {done.returncode}, stderr:\n{done.stderr}"
    assert len(lines) == 1, f"expected one line of stderr, got:\n{done.stderr}"
    assert "Traceback" not in done.stderr and "s3cret-pw" not in done.stderr
    line = lines[0]
    assert line.startswith(f"{prefix}: "), line
    for phrase in phrases:
        assert phrase in line, f"{phrase!r} not in {line!r}"
    return line


def outdated_sqlite(path: Path, revision: str = "0003") -> str:
    """An SQLite file whose handles tables stop at `revision` (older than the newest); its URL."""
    url = f"sqlite:///{path}"
    engine = create_engine(url)
    migrate.upgrade(engine, revision)
    engine.dispose()
    assert revision != migrate.head_revision()
    return url


def probe(base: str, path: str) -> tuple[int, dict[str, Any]]:
    """`GET base+path` (what a load balancer or kubelet does): the status and the JSON body."""
    response = httpx2.get(base + path, timeout=5)
    return response.status_code, response.json()


def wait_for_probe(base: str, path: str, status: int, timeout: float = 20) -> dict[str, Any]:
    """Probe `path` until it answers `status`; its body."""
    deadline = time.monotonic() + timeout
    seen: tuple[int, dict[str, Any]] | None = None
    while time.monotonic() < deadline:
        seen = probe(base, path)
        if seen[0] == status:
            return seen[1]
        time.sleep(0.1)
    raise AssertionError(f"{path} never answered {status}; last answer: {seen}")
