"""The `handles` command through its real entry point (a subprocess): on a real SQLite file, and
`handles manifest` against the example server over Streamable HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import getpass
import json
import os
import pty
import select
import sqlite3
import struct
import subprocess
import sys
import termios
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from example_server.server import create_jobs
from handles import HandlesConfig
from handles.client import Manifest
from handles.handle import new_job_id
from handles.principal import token_form
from handles.states import Status
from handles.store import JobRepository, migrate
from tests.durability.harness import config as node_config
from tests.durability.harness import crash
from tests.harness.postgres import listening, notices, repository, schema_of
from tests.harness.seed import seed_jobs
from tests.runtime.support import job_row
from tests.startup.support import UNREACHABLE_URL, assert_one_line_failure, outdated_sqlite
from tests.support import LOCAL_PRINCIPAL, HttpExampleServer, claim, free_port, token_of

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
                finished = await service.wait(started.job, 60, lambda j: j.status == "completed")
                assert finished.status == "completed", finished.status
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


ALICE = token_form(None, "reports-app", "alice")
BOB_VIA_ALICE = token_form("https://idp.example", "alice", "bob")
QUOTED = token_form(None, "reports-app", 'q"u%o te')


@pytest.fixture
def token_jobs(tmp_path: Path) -> dict[str, str]:
    """Queued jobs of token principals (as `token_principal` stores them) and of a local one."""

    async def main() -> dict[str, str]:
        jobs = create_jobs(HandlesConfig(data_dir=tmp_path, secret_keys=(KEY,), run_workers=False))
        spec = jobs.specs["export_dataset"]
        started = {}
        for name, principal in (
            ("alice", ALICE),
            ("bob_via_alice", BOB_VIA_ALICE),
            ("quoted", QUOTED),
            ("local", "local:alice"),
        ):
            started[name] = (await jobs.service.start(spec, principal, {"rows": 5}, None)).job.id
        await jobs.aclose()
        return started

    return asyncio.run(main())


def test_jobs_list_shows_readable_principals_and_finds_subjects_and_clients(
    tmp_path: Path, token_jobs: dict[str, str]
) -> None:
    def found(principal: str) -> set[str]:
        rows = run_json(tmp_path, "jobs", "list", "--json", "--principal", principal)
        return {name for name, job_id in token_jobs.items() if job_id in {r["id"] for r in rows}}

    assert found("alice") == {"alice", "bob_via_alice", "local"}
    assert found("bob") == {"bob_via_alice"}
    assert found("reports-app") == {"alice", "quoted"}
    assert found('q"u%o te') == {"quoted"}
    assert found(ALICE) == {"alice"}
    assert found("local:alice") == {"local"}
    for nothing in ("Alice", "%", "_", "a%", "https://idp.example", '"alice"'):
        assert found(nothing) == set(), nothing

    rows = {r["id"]: r for r in run_json(tmp_path, "jobs", "list", "--json")}
    readable = {name: rows[job_id]["principal_readable"] for name, job_id in token_jobs.items()}
    assert readable == {
        "alice": "alice (client reports-app)",
        "bob_via_alice": "bob (client alice, issuer https://idp.example)",
        "quoted": '"q\\"u%o te" (client reports-app)',
        "local": "local alice",
    }
    assert rows[token_jobs["alice"]]["principal"] == ALICE
    table = run(tmp_path, "jobs", "list").stdout
    assert "alice (client reports-app)" in table and "token:[" not in table
    shown = run(tmp_path, "jobs", "show", token_jobs["bob_via_alice"]).stdout
    assert "bob (client alice, issuer https://idp.example)" in shown and BOB_VIA_ALICE in shown


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
    cancelled = run(tmp_path, "jobs", "cancel", populated["queued"], "--by", "erin")
    assert cancelled.returncode == 0 and "now cancelled" in cancelled.stdout
    shown = run_json(tmp_path, "jobs", "show", populated["queued"], "--json")
    assert shown["status"] == "cancelled"
    assert shown["status_message"] == "Cancelled by the server's operator before it started."
    assert shown["cancel_requested_by"] == {"role": "operator", "name": "erin"}
    finished = run(tmp_path, "jobs", "cancel", populated["report"])
    assert "already ended (completed)" in finished.stdout


def test_watch_draws_a_bar_until_the_job_ends(tmp_path: Path, populated: dict[str, str]) -> None:
    watched = run(tmp_path, "watch", populated["report_handle"], "--interval", "0.1")
    assert watched.returncode == 0
    assert "100.0%" in watched.stdout and "completed" in watched.stdout


def test_purge_expired_deletes_only_jobs_past_retention(tmp_path: Path, populated: dict[str, str]) -> None:
    past = datetime.now(UTC) - timedelta(days=3)
    seed_jobs(
        f"sqlite:///{tmp_path / 'handles.db'}",
        3,
        kind="generate_report",
        principal="local:alice",
        id_prefix="expired-",
        created_at=past,
        expires_at=past + timedelta(days=1),
    )
    refused = run(tmp_path, "jobs", "purge")
    assert refused.returncode == 2 and "--expired" in refused.stderr
    purged = run(tmp_path, "jobs", "purge", "--expired")
    assert purged.returncode == 0 and "Purged 3 expired jobs." in purged.stdout
    remaining = {r["id"] for r in run_json(tmp_path, "jobs", "list", "--json")}
    assert remaining == {populated["report"], populated["other"], populated["queued"]}


def _watch(tmp: Path, job_id: str, **streams: Any) -> subprocess.Popen[bytes]:
    environment = dict(os.environ, HANDLES_DATA_DIR=str(tmp), HANDLES_SECRET_KEYS=KEY)
    for name in ("HANDLES_DATABASE_URL", "COLUMNS", "LINES"):
        environment.pop(name, None)
    return subprocess.Popen(
        [str(HANDLES), "watch", job_id, "--interval", "0.05"],
        env=environment,
        stderr=subprocess.PIPE,
        **streams,
    )


def _drive(tmp: Path, job_id: str, next_output: Any) -> list[bytes]:
    """Move a queued job through progress to completed, one change per piece of watch output."""
    repository = JobRepository(f"sqlite:///{tmp / 'handles.db'}")
    outputs = [next_output()]
    assert claim(repository, job_id, "test-node", 30) is not None
    assert repository.set_progress(job_id, "test-node", 1, 4, "Exporting rows " + "x" * 150)
    outputs.append(next_output())
    assert repository.set_progress(job_id, "test-node", 4, 4, "Exporting rows")
    outputs.append(next_output())
    assert repository.transition(job_id, Status.COMPLETED, owner="test-node", status_message="Done.")
    outputs.append(next_output())
    repository.dispose()
    return outputs


def test_watch_prints_one_plain_line_per_change_when_not_a_terminal(
    tmp_path: Path, populated: dict[str, str]
) -> None:
    watcher = _watch(tmp_path, populated["queued"], stdout=subprocess.PIPE)
    assert watcher.stdout is not None
    lines = _drive(tmp_path, populated["queued"], watcher.stdout.readline)
    assert watcher.wait(timeout=30) == 0, watcher.stderr.read() if watcher.stderr else ""
    assert watcher.stdout.read() == b""
    text = [line.decode() for line in lines]
    assert all(line.endswith("\n") and "\r" not in line and "\x1b" not in line for line in text), text
    assert "working" in text[0] and "25.0%" in text[1] and "100.0%" in text[2]
    assert "completed: Done." in text[3]
    assert "x" * 150 in text[1], "a plain line is not cut to any width"


def test_watch_redraws_one_line_within_the_terminal_width(tmp_path: Path, populated: dict[str, str]) -> None:
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 50, 0, 0))
    watcher = _watch(tmp_path, populated["queued"], stdin=secondary, stdout=secondary)
    os.close(secondary)
    received = bytearray()

    def next_draw() -> bytes:
        """What the watcher writes next: one read, and whatever follows it within 0.3 s."""
        chunk = bytearray(os.read(primary, 4096))
        with contextlib.suppress(OSError):  # the watcher ended: its side of the terminal is closed
            while select.select([primary], [], [], 0.3)[0]:
                more = os.read(primary, 4096)
                if not more:
                    break
                chunk.extend(more)
        received.extend(chunk)
        return bytes(chunk)

    _drive(tmp_path, populated["queued"], next_draw)
    assert watcher.wait(timeout=30) == 0
    os.close(primary)
    output = received.decode()
    draws = output.rstrip("\r\n").split("\r\x1b[2K")
    assert draws[0] == "", f"every draw returns and clears the line: {output!r}"
    assert len(draws) == 5 and all(len(draw) <= 49 for draw in draws), draws
    assert "25.0%" in output and draws[-1].startswith("export_dataset") and "100.0%" in draws[-1]
    assert "completed" in draws[-1] and output.endswith("\n")


@pytest.fixture
def retried_and_answered(tmp_path: Path) -> dict[str, str]:
    """A report whose first node died mid-run (a second node ran attempt 2) and a deployment whose
    question was answered."""

    async def main() -> dict[str, str]:
        first = create_jobs(node_config(tmp_path, secret_keys=(KEY,)))
        await first.start()
        report = await first.service.start(
            first.specs["generate_report"], "local:alice", {"account": "acme", "months": 120}, None
        )
        await crash(first)
        await first.aclose()
        await asyncio.sleep(first.config.lease_seconds + 0.1)  # the dead node's lease runs out
        second = create_jobs(node_config(tmp_path, secret_keys=(KEY,)))
        async with second.running():
            service, deploy_spec = second.service, second.specs["deploy_release"]
            done = await service.wait(report.job, 30, lambda j: j.status == "completed")
            assert (done.status, done.attempts) == ("completed", 2), done
            deploy = await service.start(deploy_spec, "local:alice", {"version": "1.2"}, None)
            asking = await service.wait(deploy.job, 30, lambda j: j.status == "input_required")
            [question] = await service.pending_inputs(asking)
            await service.respond(
                deploy_spec, asking, {question.key: {"approve": True, "environment": "staging"}}
            )
            deployed = await service.wait(deploy.job, 30, lambda j: j.status == "completed")
            assert deployed.status == "completed", deployed
        return {
            "report": report.job.id,
            "deploy": deploy.job.id,
            "question": question.key,
            "first_node": first.runtime.owner,
            "second_node": second.runtime.owner,
        }

    return asyncio.run(main())


def test_jobs_show_tells_which_node_ran_each_attempt_and_the_answered_questions(
    tmp_path: Path, retried_and_answered: dict[str, str]
) -> None:
    jobs = retried_and_answered
    report = run_json(tmp_path, "jobs", "show", jobs["report"], "--json")
    assert [(r["attempt"], r["node"], r["resumed"]) for r in report["runs"]] == [
        (1, jobs["first_node"], False),
        (2, jobs["second_node"], False),
    ]
    assert report["input_requests"] == []
    text = run(tmp_path, "jobs", "show", jobs["report"]).stdout
    assert f"attempt 1 on {jobs['first_node']}, claimed " in text
    assert f"attempt 2 on {jobs['second_node']}, claimed " in text

    deploy = run_json(tmp_path, "jobs", "show", jobs["deploy"], "--json")
    assert [(r["attempt"], r["node"], r["resumed"]) for r in deploy["runs"]] == [
        (1, jobs["second_node"], False),
        (1, jobs["second_node"], True),
    ]
    [question] = deploy["input_requests"]
    assert question["key"] == jobs["question"] and question["message"].startswith("Release 1.2 is built")
    assert question["answered"] is True and question["answered_at"] >= question["asked_at"]
    assert "answer" not in question, "answers are hidden like arguments and results"
    hidden = run(tmp_path, "jobs", "show", jobs["deploy"]).stdout
    assert "staging" not in hidden and "--reveal-results" in hidden
    assert f"attempt 1 on {jobs['second_node']}, claimed " in hidden and "(resumed)" in hidden
    assert f'{jobs["question"]}: "Release 1.2 is built' in hidden and ", answered 20" in hidden
    assert (
        '"environment": "staging"' in run(tmp_path, "jobs", "show", jobs["deploy"], "--reveal-results").stdout
    )
    revealed = run_json(tmp_path, "jobs", "show", jobs["deploy"], "--json", "--reveal-results")
    assert revealed["input_requests"][0]["answer"] == {"approve": True, "environment": "staging"}


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


def test_switches_are_recorded_with_who_and_when_and_shown_above_the_job_list(
    tmp_path: Path, populated: dict[str, str]
) -> None:
    assert "No switch was ever set" in run(tmp_path, "switches").stdout
    before = datetime.now(UTC)
    off = run(tmp_path, "tasks", "off", "--reason", "rolling back 1.4")
    assert off.returncode == 0, off.stderr
    assert f"Tasks kill switch ON, by {getpass.getuser()} at " in off.stdout
    assert "within 2 s (HANDLES_SWITCH_CACHE_SECONDS)" in off.stdout
    paused = run(tmp_path, "jobs", "pause", "generate_report", "--retry-after", "2m", "--by", "alice")
    assert paused.returncode == 0 and paused.stderr == "", paused.stderr
    assert "retry in about 120 s" in paused.stdout

    switches = {row["switch"]: row for row in run_json(tmp_path, "switches", "--json")}
    assert switches["tasks"]["changed_by"] == getpass.getuser(), "--by defaults to the OS user"
    assert switches["tasks"]["reason"] == "rolling back 1.4" and switches["tasks"]["engaged"] is True
    assert datetime.fromisoformat(switches["tasks"]["changed_at"]) >= before.replace(microsecond=0)
    assert switches["paused:generate_report"]["job"] == "generate_report"
    assert (
        switches["paused:generate_report"]["changed_by"],
        switches["paused:generate_report"]["retry_after_seconds"],
    ) == ("alice", 120)
    listing = run(tmp_path, "jobs", "list").stdout.splitlines()
    assert listing[0].startswith("Switch on: Tasks face: no new tasks, kill switch on by ")
    assert listing[0].endswith(": rolling back 1.4")
    assert listing[1].startswith("Switch on: generate_report: new starts paused by alice at ")
    assert listing[2] == "" and listing[3].startswith("ID ")
    assert isinstance(run_json(tmp_path, "jobs", "list", "--json"), list), "--json stays the list of jobs"
    table = run(tmp_path, "switches").stdout
    rows = [line.split() for line in table.splitlines()[1:]]
    assert rows[0][:4] == ["tasks", "(kill", "switch)", "ON"] and rows[1][:3] == [
        "paused:generate_report",
        "ON",
        "alice",
    ]
    assert "120s" in rows[1]

    assert "was not paused" in run(tmp_path, "jobs", "unpause", "export_dataset", "--by", "bob").stdout
    run(tmp_path, "tasks", "on", "--by", "bob")
    switches = {row["switch"]: row for row in run_json(tmp_path, "switches", "--json")}
    assert (switches["tasks"]["engaged"], switches["tasks"]["changed_by"]) == (False, "bob")
    assert run(tmp_path, "jobs", "list").stdout.splitlines()[0] == "Switch on: " + listing[1].removeprefix(
        "Switch on: "
    )


def test_switch_commands_refuse_an_empty_operator_and_note_an_unknown_job(
    tmp_path: Path, populated: dict[str, str]
) -> None:
    nobody = run(tmp_path, "tasks", "off", "--by", "  ")
    assert nobody.returncode == 2 and "--by must name who" in nobody.stderr
    typo = run(tmp_path, "jobs", "pause", "generate_reprot")
    assert typo.returncode == 0
    assert "note: no generate_reprot job is stored in this database; check the name" in typo.stderr


# -- handles manifest URL --------------------------------------------------------------------------------


def test_manifest_shows_what_a_server_offers(tmp_path: Path, http_example: HttpExampleServer) -> None:
    shown = run(tmp_path, "manifest", http_example.url)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"server    handles-example {version('mcp-handles')} at {http_example.url}"
    assert lines[1] == "protocol  2026-07-28 (server/discover: no session)"
    assert lines[2] == "tasks     offered and declared: usable (tasks/get, tasks/update, tasks/cancel)"
    assert lines[3] == "designs   2026-07-28"
    assert lines[4] == "tools     17, 3 of them jobs"
    deploy = next(line for line in lines if line.startswith("deploy_release "))
    assert deploy.split() == ["deploy_release", "tasks,", "handles,", "inline", "per_job", "yes", "adaptive"]
    assert shown.stderr == "", "no HTTP request log on a command's output"
    as_json = run(tmp_path, "manifest", http_example.url, "--json")
    manifest = Manifest.model_validate_json(as_json.stdout)
    assert manifest.jobs["deploy_release"].tools["respond"] == "deploy_release_respond"
    # What a client of the 2025-11-25 design (VS Code, the TypeScript SDK 1.x) gets on the same server.
    older = run(tmp_path, "manifest", http_example.url, "--handshake").stdout.splitlines()
    assert older[1] == "protocol  2025-11-25 (an initialize handshake)"
    assert older[2] == "tasks     not offered by the server"  # the extension: it is no 2026-07-28 connection
    assert older[3] == "designs   2025-11-25 (3 tools run as its tasks)"
    deploy = next(line for line in older if line.startswith("deploy_release "))
    assert deploy.split() == ["deploy_release", "handles,", "inline", "per_job", "yes", "adaptive"]


def test_manifest_checks_a_workflows_requirements(tmp_path: Path, http_example: HttpExampleServer) -> None:
    met = run(
        tmp_path, "manifest", http_example.url, "--modes", "inline,handles", "--job", "deploy_release:respond"
    )
    assert met.returncode == 0, met.stderr
    assert "meets the requirements: deploy_release runs handles" in met.stdout
    assert "Not inline: an inline call cannot respond" in met.stdout
    unmet = run(
        tmp_path,
        "manifest",
        http_example.url,
        "--modes",
        "inline",
        "--job",
        "deploy_release:respond",
        "--job",
        "nope",
    )
    assert unmet.returncode == 1
    assert "does not meet this workflow's requirements" in unmet.stderr
    assert "- deploy_release needs inline with respond" in unmet.stderr and "- nope: " in unmet.stderr
    wrong = run(tmp_path, "manifest", http_example.url, "--modes", "tusks")
    assert wrong.returncode == 2 and "tusks: not a mode; use tasks, handles, inline" in wrong.stderr


def test_manifest_of_a_server_it_cannot_read_exits_3(
    tmp_path: Path, http_auth_example: HttpExampleServer
) -> None:
    refused = run(tmp_path, "manifest", http_auth_example.url)
    assert refused.returncode == 3
    assert refused.stderr.startswith(f"handles: could not read the manifest of {http_auth_example.url}: ")
    assert "HTTP 401" in refused.stderr and "Traceback" not in refused.stderr
    allowed = run(tmp_path, "manifest", http_auth_example.url, "--token", token_of("alice"), "--json")
    assert Manifest.model_validate_json(allowed.stdout).tasks_usable
    down = run(tmp_path, "manifest", f"http://127.0.0.1:{free_port()}/mcp")
    assert down.returncode == 3 and "could not read the manifest" in down.stderr
    assert len(down.stderr.strip().splitlines()) == 1, down.stderr


def test_a_stored_id_that_begins_with_a_dash_is_taken_as_the_id_it_is(
    tmp_path: Path, populated: dict[str, str]
) -> None:
    """Ids were once drawn with a leading `-` now and then (1 in 64): the CLI still takes them as ids."""
    dashed = "-" + populated["queued"][1:]
    with sqlite3.connect(tmp_path / "handles.db") as db:
        db.execute("UPDATE handles_jobs SET id = ? WHERE id = ?", (dashed, populated["queued"]))
    shown = run_json(tmp_path, "jobs", "show", dashed, "--json")
    assert shown["id"] == dashed and shown["status"] == "working"
    assert run_json(tmp_path, "jobs", "show", "--json", dashed)["id"] == dashed
    cancelled = run(tmp_path, "jobs", "cancel", dashed)
    assert cancelled.returncode == 0, cancelled.stderr
    assert run_json(tmp_path, "jobs", "show", dashed, "--json")["status"] == "cancelled"
    evidence = run(tmp_path, "audit", "export", "--live", "--job", dashed)
    assert evidence.returncode == 0, evidence.stderr
    assert [json.loads(line)["job_id"] for line in evidence.stdout.splitlines()] == [dashed]


def test_new_job_ids_never_begin_with_a_dash() -> None:
    assert not any(new_job_id().startswith("-") for _ in range(5000))


def test_a_cancel_on_postgresql_sends_its_notice_naming_its_schema(tmp_path: Path, postgres_url: str) -> None:
    """`handles jobs cancel` tells the nodes at once, as a node's own writes do: its change notice names the
    schema of its store's tables, which the nodes of that deployment take and those of another ignore."""
    with repository(postgres_url) as repo, listening(postgres_url) as listener:
        job = job_row(new_job_id())  # working, held by no node: queued
        repo.insert(job)
        cancelled = run(tmp_path, "jobs", "cancel", job.id, HANDLES_DATABASE_URL=postgres_url)
        assert cancelled.returncode == 0, cancelled.stderr
        assert notices(listener, job.id) == [f"{job.id} cli changed {schema_of(postgres_url)}"]


def test_cancel_messages_say_who_cancelled_and_when_and_jobs_show_records_who_asked(tmp_path: Path) -> None:
    """An operator's cancel (`handles jobs cancel`, a subprocess) of a running job and of a job parked on its
    question, and a caller's cancel of a parked job that had started: each status message, as the caller
    reads it through the handle tools, says truly who cancelled and when; `jobs show` records who asked,
    and the caller never sees the operator's name."""
    server = HttpExampleServer(tmp_path, [KEY], env={"EXAMPLE_JOB_SECONDS": "12"})

    async def call(tool: str, **arguments: Any) -> dict[str, Any]:
        async with Client(server.url) as client:
            result = await client.call_tool(tool, arguments)
        assert result.structured_content is not None, result
        assert "dana" not in json.dumps(result.structured_content), "the operator's name reached the caller"
        return result.structured_content

    async def until(job: str, handle: str, predicate: Any) -> None:
        for _ in range(60):
            if predicate(await call(f"{job}_progress", handle=handle, wait_seconds=1)):
                return
        raise AssertionError(f"{job} never got there")

    async def main() -> dict[str, str]:
        export = (await call("export_dataset_start", rows=1000))["handle"]
        parked = {
            who: (await call("deploy_release_start", version=who))["handle"] for who in ("caller", "operator")
        }
        await until("export_dataset", export, lambda s: (s["progress"]["done"] or 0) > 0)
        cancelled = run(tmp_path, "jobs", "cancel", export, "--by", "dana")
        assert cancelled.returncode == 0 and "Cancellation requested" in cancelled.stdout, cancelled.stderr
        final = await call("export_dataset_fetch", handle=export, wait_seconds=20)
        assert (final["status"], final["status_message"]) == (
            "cancelled",
            "Cancelled by the server's operator.",
        )

        for handle in parked.values():
            await until("deploy_release", handle, lambda s: s["status"] == "input_required")
        by_caller = await call("deploy_release_cancel", handle=parked["caller"])
        assert (by_caller["status"], by_caller["status_message"]) == (
            "cancelled",
            "Cancelled at the caller's request while it waited for an answer.",
        )
        cancelled = run(tmp_path, "jobs", "cancel", parked["operator"], "--by", "dana")
        assert cancelled.returncode == 0, cancelled.stderr
        by_operator = await call("deploy_release_fetch", handle=parked["operator"])
        assert (by_operator["status"], by_operator["status_message"]) == (
            "cancelled",
            "Cancelled by the server's operator while it waited for an answer.",
        )
        return {"export": export, **parked}

    with server.running():
        handles = asyncio.run(main())
    shown = {name: run_json(tmp_path, "jobs", "show", handle, "--json") for name, handle in handles.items()}
    assert shown["caller"]["cancel_requested_by"] == {"role": "caller", "name": LOCAL_PRINCIPAL}
    for name in ("export", "operator"):
        assert shown[name]["cancel_requested_by"] == {"role": "operator", "name": "dana"}, name
    assert all(job["cancel_requested_at"] for job in shown.values())
    text = run(tmp_path, "jobs", "show", handles["operator"]).stdout
    assert "cancel_requested_by  operator dana" in text, text
