"""kill -9 the example server (a real subprocess over Streamable HTTP) while it runs a job: the job's
progress reply, `handles jobs list` and `handles jobs show` (run as subprocesses) say its node has gone
quiet and by when another node takes the job over, and the takeover comes by then."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.harness.process import REPO_ROOT, ServerProcess

from .harness import KEY, example_node
from .test_crash_recovery import _call, _until

LEASE_SECONDS, SWEEP_SECONDS = 30, 0.3
LEASE = {
    "HANDLES_LEASE_SECONDS": str(LEASE_SECONDS),
    "HANDLES_HEARTBEAT_SECONDS": "0.3",
    "HANDLES_SWEEP_SECONDS": str(SWEEP_SECONDS),
}
"""A lease long enough for the killed server to restart before it runs out, renewed often (so a quiet node
is told apart within a couple of seconds), swept often (so the takeover comes soon after it runs out)."""
HANDLES = Path(sys.executable).parent / "handles"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    # a report of 60 months over 60 s: progress every second, and retried after a crash
    process = example_node(tmp_path, EXAMPLE_JOB_SECONDS="60", **LEASE)
    process.start()
    yield process
    process.stop()


def handles_command(data_dir: Path, *args: str) -> str:
    """`handles <args>` as an operator runs it, on the server's database and lease settings."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), HANDLES_DATA_DIR=str(data_dir), HANDLES_SECRET_KEYS=KEY)
    env.pop("HANDLES_DATABASE_URL", None)
    done = subprocess.run(
        [str(HANDLES), *args], capture_output=True, text=True, env=env | LEASE, timeout=60, check=False
    )
    assert done.returncode == 0, f"handles {' '.join(args)} exited {done.returncode}: {done.stderr}"
    return done.stdout


def contact_of(data_dir: Path, *args: str) -> dict[str, Any]:
    """The `node_contact` of the one job `handles jobs list --json` (or `show --json`) prints."""
    shown = json.loads(handles_command(data_dir, *args, "--json"))
    job = shown[0] if isinstance(shown, list) else shown
    assert job["status"] == "working", job
    contact: dict[str, Any] | None = job["node_contact"]
    assert contact is not None, f"no node holds the job (taken over already?): {job}"
    return contact


def test_after_kill_9_the_reply_and_the_cli_say_the_node_is_quiet_and_when_it_is_taken_over(
    server: ServerProcess, tmp_path: Path
) -> None:
    async def main() -> None:
        started, _ = await _call(server.url, "generate_report_start", account="acme", months=60)
        handle = started["handle"]
        running = await _until(
            server.url, "generate_report", handle, lambda s: (s["progress"]["done"] or 0) > 0
        )
        # a healthy job: nothing alarming anywhere
        assert "heard" not in (running["status_message"] or ""), running
        assert running["next"].startswith("The job is still running."), running
        healthy = contact_of(tmp_path, "jobs", "list")
        assert healthy["quiet"] is False and healthy["summary"].startswith("heard "), healthy
        assert "quiet" not in handles_command(tmp_path, "jobs", "list")

        server.kill()
        killed_at = datetime.now(UTC)
        server.start()  # on the same database, before the killed one's lease runs out
        await asyncio.sleep(max(0.0, 2.5 - (datetime.now(UTC) - killed_at).total_seconds()))

        # more than two missed renewals and a second after the kill
        reply, is_error = await _call(server.url, "generate_report_progress", handle=handle)
        assert not is_error and reply["status"] == "working" and reply["attempts"] == 1, reply
        message = reply["status_message"]
        assert "has not been heard from for" in message and "another server takes the job over by" in message
        assert "Do not start a new job" in reply["next"] and "generate_report_progress" in reply["next"], (
            reply
        )
        assert "runs it again" in reply["next"], reply
        # never which node: the caller's reply names no server
        assert "node" not in json.dumps(reply).lower(), reply

        listed = contact_of(tmp_path, "jobs", "list")
        shown = contact_of(tmp_path, "jobs", "show", handle)
        for contact in (listed, shown):
            assert contact["quiet"] is True, contact
            last_heard = datetime.fromisoformat(contact["last_heard_at"])
            takeover_by = datetime.fromisoformat(contact["takeover_by"])
            assert killed_at - timedelta(seconds=2) < last_heard <= killed_at, contact
            assert takeover_by == last_heard + timedelta(seconds=LEASE_SECONDS + SWEEP_SECONDS), contact
            assert contact["silent_seconds"] >= 2, contact
        clock = datetime.fromisoformat(listed["takeover_by"]).strftime("%H:%M:%S UTC")
        assert f"by {clock}" in message and f"by {clock}" in reply["next"], reply
        table = handles_command(tmp_path, "jobs", "list")
        assert f"another node takes over by {clock}" in table and "quiet" in table, table
        text = handles_command(tmp_path, "jobs", "show", handle)
        assert "last heard" in text and "taken over by" in text, text

        retried = await _until(
            server.url, "generate_report", handle, lambda s: s["attempts"] == 2, timeout=40
        )
        # when the second attempt was claimed, as the store recorded it (not when this test's poll saw it)
        runs = json.loads(handles_command(tmp_path, "jobs", "show", handle, "--json"))["runs"]
        claimed = datetime.fromisoformat(next(run for run in runs if run["attempt"] == 2)["claimed_at"])
        promised = datetime.fromisoformat(listed["takeover_by"])
        assert claimed < promised + timedelta(seconds=5), (
            "taken over later than promised",
            claimed,
            promised,
        )
        assert "heard" not in (retried["status_message"] or ""), retried

    began = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - began < 120
