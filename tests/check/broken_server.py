"""A tiny MCP server (the `mcp` SDK, not `handles`) with one job and one deliberate fault, for `handles check`.

`python -m tests.check.broken_server --port N --tokens FILE --fault F`, where F is:
- `none`: no fault (every gate passes);
- `leak`: answers any principal's handle with its job's status;
- `duplicate`: starts a second job when a start is retried with the same idempotency key;
- `revive`: reports a cancelled job `cancelled`, then `completed` a moment later;
- `chatty`: shows the job's sensitive note in its status, and a stack trace in its errors.
"""

from __future__ import annotations

import argparse
import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from example_server.__main__ import FileTokenVerifier

REVIVE_SECONDS = 0.5
"""How long a `revive` server shows a cancelled job as cancelled before it shows it completed."""


@dataclass
class Job:
    owner: str
    note: str
    seconds: float
    started: float
    cancelled_at: float | None = None

    def status(self, fault: str) -> str:
        if self.cancelled_at is not None:
            revived = fault == "revive" and time.monotonic() - self.cancelled_at > REVIVE_SECONDS
            return "completed" if revived else "cancelled"
        return "completed" if time.monotonic() - self.started >= self.seconds else "working"


def build(fault: str, tokens: dict[str, str], port: int) -> MCPServer:
    base = f"http://127.0.0.1:{port}"
    server = MCPServer(
        "broken-jobs",
        token_verifier=FileTokenVerifier(tokens),
        auth=AuthSettings(issuer_url=base, resource_server_url=f"{base}/mcp", validate_token_resource=False),
    )
    jobs: dict[str, Job] = {}
    keys: dict[tuple[str, str], str] = {}

    def caller() -> str:
        token = get_access_token()
        return token.client_id if token is not None else "anonymous"

    def find(handle: str) -> Job:
        job = jobs.get(handle)
        if job is None or (job.owner != caller() and fault != "leak"):
            trace = ' (Traceback (most recent call last): File "/srv/jobs/store.py", line 12)'
            raise ToolError(f"No job has the handle {handle}." + (trace if fault == "chatty" else ""))
        return job

    @server.tool()
    def slow_job_start(seconds: float, note: str, idempotency_key: str | None = None) -> dict[str, Any]:
        """Start a job that works for `seconds`."""
        if idempotency_key is not None and fault != "duplicate" and (caller(), idempotency_key) in keys:
            handle = keys[(caller(), idempotency_key)]
            return {"handle": handle, "status": jobs[handle].status(fault), "created": False}
        handle = secrets.token_urlsafe(24)
        jobs[handle] = Job(caller(), note, seconds, time.monotonic())
        if idempotency_key is not None:
            keys[(caller(), idempotency_key)] = handle
        return {"handle": handle, "status": "working", "created": True}

    @server.tool()
    def slow_job_progress(handle: str) -> dict[str, Any]:
        """The job's status."""
        job = find(handle)
        status = job.status(fault)
        about = f" on {job.note}" if fault == "chatty" else ""
        return {"status": status, "status_message": f"The job is {status}{about}.", "poll_after_ms": 200}

    @server.tool()
    def slow_job_fetch(handle: str) -> dict[str, Any]:
        """The job's result once it completed."""
        status = find(handle).status(fault)
        return {"status": status, "result": {"done": True} if status == "completed" else None}

    @server.tool()
    def slow_job_cancel(handle: str) -> dict[str, Any]:
        """Cancel the job (a job that ended stays as it ended)."""
        job = find(handle)
        if job.status(fault) == "working":
            job.cancelled_at = time.monotonic()
        return {"status": job.status(fault), "cancel_requested": True}

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", type=Path, required=True)
    parser.add_argument("--fault", choices=["none", "leak", "duplicate", "revive", "chatty"], default="none")
    args = parser.parse_args()
    server = build(args.fault, json.loads(args.tokens.read_text()), args.port)
    server.run("streamable-http", host="127.0.0.1", port=args.port, stateless_http=True)


if __name__ == "__main__":
    main()
