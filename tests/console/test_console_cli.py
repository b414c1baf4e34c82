"""`handles console` through its real entry point: it refuses to start open, and serves the console."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx2 as httpx

from handles.store import JobRepository
from tests.cli.test_cli import HANDLES, KEY, run
from tests.console.support import TOKEN
from tests.store.test_repository_contract import new_job
from tests.support import free_port


def test_it_refuses_to_start_without_a_token(tmp_path: Path) -> None:
    for token in ("", "too-short"):
        done = run(tmp_path, "console", "--port", str(free_port()), HANDLES_CONSOLE_TOKEN=token)
        assert done.returncode == 2
        assert "HANDLES_CONSOLE_TOKEN" in done.stderr and "never starts open" in done.stderr


def test_it_serves_the_console_on_the_configured_database(tmp_path: Path) -> None:
    repo = JobRepository(f"sqlite:///{(tmp_path / 'handles.db').as_posix()}")
    repo.prepare(auto_migrate=True)
    job = new_job(repo, kind="generate_report")
    repo.dispose()
    port = free_port()
    env = dict(
        os.environ, HANDLES_DATA_DIR=str(tmp_path), HANDLES_SECRET_KEYS=KEY, HANDLES_CONSOLE_TOKEN=TOKEN
    )
    env.pop("HANDLES_DATABASE_URL", None)
    process = subprocess.Popen(
        [str(HANDLES), "console", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, process.stdout.read() if process.stdout else ""
            try:
                anonymous = httpx.get(f"http://127.0.0.1:{port}/", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the console never answered"
                time.sleep(0.1)
        assert anonymous.status_code == 401 and job.id not in anonymous.text
        feed = httpx.get(f"http://127.0.0.1:{port}/api/jobs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert [row["id"] for row in feed.json()["jobs"]] == [job.id]
    finally:
        process.terminate()
        process.wait(timeout=15)
