"""A stdio server whose client goes away while jobs run: they are handed over before the client's kill.

An MCP client ends a stdio server as the specification's stdio transport says: it closes the server's
stdin, waits, sends SIGTERM, waits, sends SIGKILL. The official SDKs wait 2 s at each step (the Python
SDK's `PROCESS_TERMINATION_TIMEOUT` and `FORCE_KILL_TIMEOUT`; the TypeScript SDK's, which the MCP
Inspector runs, the same). A server that spends its whole drain (25 s by default) letting jobs finish is
killed halfway through it: its running jobs keep their leases until the leases run out, and no other
process takes them over before that.

So when the client has gone (stdin closed), a SIGTERM ends the drain at once: a `retry` job still running
is handed back for any process (the next stdio server takes it at once), any other ends `failed` as
interrupted by a shutdown. These tests run the example over stdio with the official client and leave
as that client leaves.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from tests.support import FRAMEWORKS, REPO_ROOT, framework_args

from .harness import KEY, stored_jobs

pytestmark = pytest.mark.timeout(120)


def stdio_server(data_dir: Path, framework: str, **env: str) -> StdioServerParameters:
    settings = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", str(data_dir)),
        "PYTHONPATH": str(REPO_ROOT),
        "HANDLES_DATA_DIR": str(data_dir),
        "HANDLES_SECRET_KEYS": KEY,
        "HANDLES_DRAIN_SECONDS": "25",
        "HANDLES_LEASE_SECONDS": "30",
    }
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "example_server", *framework_args(framework)],
        env=settings | env,
        cwd=REPO_ROOT,
    )


async def start(client: Client, tool: str, **arguments: Any) -> str:
    result = await client.call_tool(tool, arguments)
    assert result.structured_content is not None, result
    return str(result.structured_content["handle"])


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_jobs_running_when_a_stdio_client_leaves_are_handed_over_before_its_kill(
    tmp_path: Path, framework: str
) -> None:
    async with Client(stdio_server(tmp_path, framework, EXAMPLE_JOB_SECONDS="60")) as client:
        report = await start(client, "generate_report_start", account="acme", months=3)
        export = await start(client, "export_dataset_start", rows=100)
        await anyio.sleep(0.3)  # both are running: the client leaves now
    # The client has closed stdin, waited 2 s, sent SIGTERM and seen the server exit.
    retried, failed = stored_jobs(tmp_path, report, export)
    assert retried.status == "working" and retried.lease_owner is None, (retried.status, retried.lease_owner)
    assert retried.status_message == "Its server is shutting down; another server continues it now."
    assert failed.status == "failed", (failed.status, failed.status_message)
    assert "shut" in failed.status_message.lower(), failed.status_message

    # The next stdio server (the client's next session) takes the handed-back job at once: no lease to wait out.
    async with Client(stdio_server(tmp_path, framework, EXAMPLE_JOB_SECONDS="0.3")) as client:
        began = time.monotonic()
        fetched = await client.call_tool("generate_report_fetch", {"handle": report, "wait_seconds": 25})
        waited = time.monotonic() - began
    assert fetched.structured_content is not None and fetched.structured_content["status"] == "completed", (
        fetched
    )
    assert waited < 20, f"{waited:.1f} s: the job waited for its old lease"
