"""The `handles` command through its real entry point (a subprocess) on a real SQLite file."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from example_server.server import create_jobs
from handles import HandlesConfig
from handles.store import JobRecord, JobRepository, migrate
from tests.startup.support import UNREACHABLE_URL, assert_one_line_failure, outdated_sqlite

KEY = "cli-test-key-" + "c" * 40
HANDLES = Path(sys.executable).parent / "handles"


def run(tmp: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = dict(os.environ, HANDLES_DATA_DIR=str(tmp), HANDLES_SECRET_KEYS=KEY)
    environment.pop("HANDLES_DATABASE_URL", None)
    environment.update(env)
    return subprocess.run([str(HANDLES), *args], capture_output=True, text=True, env=environment, timeout=60)


def run_json(tmp: Path, *args: str) -> Any:
    """A command's `--json` output; a failed command fails the test with its exit code and stderr."""
    done = run(tmp, *args)
    assert done.returncode == 0, f"handles {' '.join(args)} exited {done.returncode}: {done.stderr}"
    return json.loads(done.stdout)


@pytest.fixture
def populated(tmp_path: Path) -> dict[str, str]:
    """Two finished jobs (a report and a failed-looking one) and a queued export, started in-process."""

    async def main() -> dict[str, str]:
        jobs = create_jobs(HandlesConfig(data_dir=tmp_path, secret_keys=(KEY,)))
        async with jobs.running():
            service = jobs.service
            report = await service.start(
                jobs.specs["generate_report"], "local:alice", {"account": "acme", "months": 1}, None
            )
            other = await service.start(
                jobs.specs["generate_report"], "local:bob", {"account": "bobco", "months": 1}, None
            )
            for started in (report, other):
                await service.wait(started.job, 10, lambda j: j.status == "completed")
        queued_jobs = create_jobs(HandlesConfig(data_dir=tmp_path, secret_keys=(KEY,), run_workers=False))
        queued = await queued_jobs.service.start(
            queued_jobs.specs["export_dataset"], "local:alice", {"rows": 5}, None
        )
        await queued_jobs.aclose()
        return {
            "report": report.job.id,
            "report_handle": report.handle,
            "other": other.job.id,
            "queued": queued.job.id,
        }

    return asyncio.run(main())


def test_keygen_prints_fresh_long_keys(tmp_path: Path) -> None:
    first, second = run(tmp_path, "keygen"), run(tmp_path, "keygen")
    assert first.returncode == 0 and len(first.stdout.strip()) >= 64
    assert first.stdout != second.stdout


def test_db_upgrade_creates_then_reports_current(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    created = run(tmp_path, "db", "upgrade", "--database-url", url)
    assert created.returncode == 0, created.stderr
    assert f"empty -> {migrate.head_revision()}" in created.stdout
    again = run(tmp_path, "db", "upgrade", "--database-url", url)
    assert f"{migrate.head_revision()} (current)" in again.stdout


def test_jobs_list_json_and_filters(tmp_path: Path, populated: dict[str, str]) -> None:
    listed = run(tmp_path, "jobs", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert {r["id"] for r in rows} == {populated["report"], populated["other"], populated["queued"]}
    completed = run_json(tmp_path, "jobs", "list", "--json", "--status", "completed")
    assert {r["id"] for r in completed} == {populated["report"], populated["other"]}
    alice = run_json(tmp_path, "jobs", "list", "--json", "--principal", "local:alice")
    assert {r["id"] for r in alice} == {populated["report"], populated["queued"]}
    exports = run_json(tmp_path, "jobs", "list", "--json", "--job", "export_dataset")
    assert [r["status"] for r in exports] == ["working"]
    assert run_json(tmp_path, "jobs", "list", "--json", "--older-than", "1h") == []
    table = run(tmp_path, "jobs", "list").stdout
    assert table.splitlines()[0].split()[:3] == ["ID", "JOB", "STATUS"] and populated["report"] in table


def test_jobs_show_hides_values_unless_asked(tmp_path: Path, populated: dict[str, str]) -> None:
    shown = run_json(tmp_path, "jobs", "show", populated["report"], "--json")
    assert shown["status"] == "completed" and shown["attempts"] == 1
    assert "result" not in shown and "arguments" not in shown
    by_handle = run_json(tmp_path, "jobs", "show", populated["report_handle"], "--json")
    assert by_handle["id"] == populated["report"]
    revealed = run_json(tmp_path, "jobs", "show", populated["report"], "--json", "--reveal-results")
    assert revealed["arguments"] == {"account": "acme", "months": 1}
    assert revealed["result"]["structuredContent"]["account"] == "acme"
    assert "--reveal-results" in run(tmp_path, "jobs", "show", populated["report"]).stdout


def test_clear_errors_for_unknown_id_foreign_key_and_bad_database(
    tmp_path: Path, populated: dict[str, str]
) -> None:
    unknown = run(tmp_path, "jobs", "show", "no-such-job")
    assert unknown.returncode == 2 and "No job 'no-such-job'" in unknown.stderr
    foreign = run(tmp_path, "jobs", "show", populated["report_handle"], HANDLES_SECRET_KEYS="z" * 40)
    assert foreign.returncode == 2 and "not signed by any key" in foreign.stderr
    unreachable = run(
        tmp_path, "jobs", "list", HANDLES_DATABASE_URL="postgresql+psycopg://nobody@127.0.0.1:9/none"
    )
    assert unreachable.returncode == 2 and "Cannot reach the database" in unreachable.stderr
    invalid = run(tmp_path, "jobs", "list", HANDLES_DATABASE_URL="nonsense://x")
    assert invalid.returncode == 2 and "not a valid database URL" in invalid.stderr
    missing = run(tmp_path / "elsewhere", "jobs", "list")
    assert missing.returncode == 2 and "There is no handles database" in missing.stderr


def test_cancel_queued_and_finished_jobs(tmp_path: Path, populated: dict[str, str]) -> None:
    cancelled = run(tmp_path, "jobs", "cancel", populated["queued"])
    assert cancelled.returncode == 0 and "now cancelled" in cancelled.stdout
    assert run_json(tmp_path, "jobs", "show", populated["queued"], "--json")["status"] == "cancelled"
    finished = run(tmp_path, "jobs", "cancel", populated["report"])
    assert "already ended (completed)" in finished.stdout


def test_watch_draws_a_bar_until_the_job_ends(tmp_path: Path, populated: dict[str, str]) -> None:
    watched = run(tmp_path, "watch", populated["report_handle"], "--interval", "0.1")
    assert watched.returncode == 0
    assert "100.0%" in watched.stdout and "completed" in watched.stdout


def test_purge_expired_deletes_only_jobs_past_retention(tmp_path: Path, populated: dict[str, str]) -> None:
    repository = JobRepository(f"sqlite:///{tmp_path / 'handles.db'}")
    past = datetime.now(UTC) - timedelta(days=3)
    for i in range(3):
        repository.insert(
            JobRecord(
                id=f"expired-{i}",
                kind="generate_report",
                principal="local:alice",
                status="completed",
                arguments={},
                arguments_digest="-",
                created_at=past,
                updated_at=past,
                run_after=past,
                expires_at=past + timedelta(days=1),
            )
        )
    repository.dispose()
    refused = run(tmp_path, "jobs", "purge")
    assert refused.returncode == 2 and "--expired" in refused.stderr
    purged = run(tmp_path, "jobs", "purge", "--expired")
    assert purged.returncode == 0 and "Purged 3 expired jobs." in purged.stdout
    remaining = {r["id"] for r in run_json(tmp_path, "jobs", "list", "--json")}
    assert remaining == {populated["report"], populated["other"], populated["queued"]}


def test_db_upgrade_and_worker_on_an_unreachable_database_fail_in_one_line(tmp_path: Path) -> None:
    upgrade = run(tmp_path, "db", "upgrade", "--database-url", UNREACHABLE_URL)
    assert "***" in assert_one_line_failure(upgrade, "handles", "Cannot reach the database", "127.0.0.1:9")
    worker = run(
        tmp_path, "worker", "--app", "example_server.server:create_jobs", HANDLES_DATABASE_URL=UNREACHABLE_URL
    )
    assert_one_line_failure(worker, "handles", "Cannot reach the database", "HANDLES_DATABASE_URL")
    listing = run(tmp_path, "jobs", "list", HANDLES_DATABASE_URL=UNREACHABLE_URL)
    assert_one_line_failure(listing, "handles", "Cannot reach the database")


def test_worker_on_an_outdated_schema_says_to_run_db_upgrade(tmp_path: Path) -> None:
    url = outdated_sqlite(tmp_path / "old.db")
    worker = run(
        tmp_path,
        "worker",
        "--app",
        "example_server.server:create_jobs",
        HANDLES_DATABASE_URL=url,
        HANDLES_AUTO_MIGRATE="0",
    )
    assert_one_line_failure(worker, "handles", "0003", "handles db upgrade")
