"""`handles console` through its real entry point: it refuses to start open, and serves the console."""

from __future__ import annotations

from pathlib import Path

import httpx2 as httpx

from handles.store import JobRepository
from tests.cli.test_cli import KEY, run
from tests.console.support import TOKEN, console_process
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
    process = console_process(tmp_path, [KEY], port).start()
    try:
        anonymous = httpx.get(f"http://127.0.0.1:{port}/", timeout=2)
        assert anonymous.status_code == 401 and job.id not in anonymous.text
        feed = httpx.get(f"http://127.0.0.1:{port}/api/jobs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert [row["id"] for row in feed.json()["jobs"]] == [job.id]
    finally:
        process.stop()
