"""A tiny MCP server (the `mcp` SDK, not `handles`) with one job and one deliberate fault, for `handles check`.

`python -m tests.check.broken_server --port N --tokens FILE --fault F`, where F is:
- `none`: no fault (every gate passes);
- `leak`: answers any principal's handle with its job's status;
- `duplicate`: starts a second job when a start is retried with the same idempotency key;
- `revive`: reports a cancelled job `cancelled`, then `completed` a moment later;
- `chatty`: shows the job's sensitive note in its status, and a stack trace in its errors;
- `list-leak`: its 2025-11-25 `tasks/list` lists every principal's tasks;
- `link-leak`: `resources/read` of a finished job's result link answers any principal;
- `unserved-tasks`: advertises the 2025-11-25 tasks design (and marks `slow_job` for it), serves none of it;
- `tasks-without-calls`: the same, but its `capabilities.tasks` does not declare `requests.tools.call` (no
  fault: that design then runs no tool as a task, whatever `execution.taskSupport` says);
- `escapes`: terminal escape sequences in its name and in its errors (a hostile server, for the commands
  that print what a server says).

A client that connects with `initialize` at 2025-11-25 is also served that version's tasks design: the
`slow_job` tool takes a task, followed with `tasks/get`, `tasks/result`, `tasks/list` and `tasks/cancel`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError

from example_server.__main__ import FileTokenVerifier

REVIVE_SECONDS = 0.5
"""How long a `revive` server shows a cancelled job as cancelled before it shows it completed."""

ESCAPE = "\x1b]0;owned\x07\x1b[2J"
"""A window title set, then the screen cleared: what a terminal would do with the `escapes` server's text."""

LINK_PREFIX = "broken-jobs://results/"
"""A finished job's result link: this, then its handle."""


@dataclass
class Job:
    owner: str
    note: str
    seconds: float
    started: float
    cancelled_at: float | None = None

    def task(self, handle: str, fault: str) -> dict[str, Any]:
        """The job as a task of the 2025-11-25 design."""
        created = datetime.datetime.now(datetime.UTC).isoformat()
        return {
            "taskId": handle,
            "status": self.status(fault),
            "createdAt": created,
            "lastUpdatedAt": created,
            "ttl": 600000,
            "pollInterval": 200,
        }

    def status(self, fault: str) -> str:
        if self.cancelled_at is not None:
            revived = fault == "revive" and time.monotonic() - self.cancelled_at > REVIVE_SECONDS
            return "completed" if revived else "cancelled"
        return "completed" if time.monotonic() - self.started >= self.seconds else "working"


def build(fault: str, tokens: dict[str, str], port: int) -> MCPServer:
    base = f"http://127.0.0.1:{port}"
    jobs: dict[str, Job] = {}

    async def older_tasks(ctx: Any, call_next: Any) -> Any:
        """The 2025-11-25 tasks design, for a client connected at that version."""
        params = ctx.params or {}
        if ctx.method == "resources/read":
            uri = str(params.get("uri"))
            job = jobs.get(uri.removeprefix(LINK_PREFIX))
            if (
                job is None
                or (job.owner != caller() and fault != "link-leak")
                or not uri.startswith(LINK_PREFIX)
            ):
                raise MCPError(code=-32602, message=f"No result is readable at {uri}.")
            return {"contents": [{"uri": uri, "mimeType": "text/plain", "text": job.status(fault)}]}
        if ctx.method == "initialize":
            result = await call_next(ctx)
            if result.get("protocolVersion") == "2025-11-25":
                calls = {} if fault == "tasks-without-calls" else {"requests": {"tools": {"call": {}}}}
                result["capabilities"]["tasks"] = {"list": {}, "cancel": {}, **calls}
            return result
        unserved = fault in ("unserved-tasks", "tasks-without-calls") and ctx.method != "tools/list"
        if ctx.protocol_version != "2025-11-25" or unserved:
            return await call_next(ctx)
        if ctx.method == "tools/call" and params.get("name") == "slow_job" and "task" in params:
            arguments = params.get("arguments") or {}
            handle = secrets.token_urlsafe(24)
            jobs[handle] = Job(
                caller(), arguments.get("note", ""), arguments.get("seconds", 1.0), time.monotonic()
            )
            return {"task": jobs[handle].task(handle, fault)}
        if ctx.method == "tasks/list":
            mine = {h: job for h, job in jobs.items() if job.owner == caller() or fault == "list-leak"}
            return {"tasks": [job.task(handle, fault) for handle, job in mine.items()]}
        if not ctx.method.startswith("tasks/"):
            result = await call_next(ctx)
            if ctx.method == "tools/list":
                for tool in result["tools"]:
                    if tool["name"] == "slow_job":
                        tool["execution"] = {"taskSupport": "optional"}
            return result
        handle = str(params.get("taskId"))
        try:
            job = find(handle)
        except ToolError as exc:
            raise MCPError(code=-32602, message=str(exc)) from None
        if ctx.method == "tasks/cancel" and job.status(fault) != "working":
            raise MCPError(code=-32602, message="The task already ended.")
        if ctx.method == "tasks/cancel":
            job.cancelled_at = time.monotonic()
        while ctx.method == "tasks/result" and job.status(fault) == "working":
            await anyio.sleep(0.1)
        if ctx.method == "tasks/result":
            done = job.status(fault) == "completed"
            return {"content": [{"type": "text", "text": job.status(fault)}], "isError": not done}
        return job.task(handle, fault)

    server = MCPServer(
        "broken-jobs" + (ESCAPE if fault == "escapes" else ""),
        middleware=[older_tasks],
        token_verifier=FileTokenVerifier(tokens),
        auth=AuthSettings(issuer_url=base, resource_server_url=f"{base}/mcp", validate_token_resource=False),
    )
    keys: dict[tuple[str, str], str] = {}

    def caller() -> str:
        token = get_access_token()
        return token.client_id if token is not None else "anonymous"

    def find(handle: str) -> Job:
        job = jobs.get(handle)
        if job is None or (job.owner != caller() and fault != "leak"):
            trace = ' (Traceback (most recent call last): File "/srv/jobs/store.py", line 12)'
            raise ToolError(
                f"No job has the handle {handle}."
                + (trace if fault == "chatty" else "")
                + (ESCAPE if fault == "escapes" else "")
            )
        return job

    @server.tool()
    async def slow_job(seconds: float, note: str) -> dict[str, Any]:
        """Work for `seconds` and answer (a task of the 2025-11-25 design when asked for one)."""
        await anyio.sleep(seconds)
        return {"done": True}

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
        return {"handle": handle, "status": "working", "created": True, "poll_after_ms": 200}

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
        if status != "completed":
            return {"status": status, "result": None}
        return {"status": status, "result_link": {"uri": LINK_PREFIX + handle, "parts": 1}}

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
    parser.add_argument(
        "--fault",
        choices=[
            "none",
            "leak",
            "duplicate",
            "revive",
            "chatty",
            "list-leak",
            "link-leak",
            "unserved-tasks",
            "tasks-without-calls",
            "escapes",
        ],
        default="none",
    )
    args = parser.parse_args()
    server = build(args.fault, json.loads(args.tokens.read_text()), args.port)
    server.run("streamable-http", host="127.0.0.1", port=args.port, stateless_http=True)


if __name__ == "__main__":
    main()
