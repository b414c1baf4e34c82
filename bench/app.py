"""The benchmark server: one no-op plain tool and one job of a tunable length, on the official SDK.

- `noop()`: an ordinary tool that does nothing and returns a tiny structured result (the baseline).
- `progress_shaped()`: an ordinary tool that runs no `handles` code and returns, prebuilt, a result of
  the size and output schema of a `work_progress` result (the SDK's and the transport's share of one).
- `work(seconds=0.0, mark="")`: a `handles` job that sleeps `seconds` (0: returns at once) and
  returns a small structured result. In-process benchmarks pass a `mark` to learn the moment the
  job function started (`STARTED[mark]`, `time.perf_counter()`), and can hold a job open until
  they release it (`gate(mark)`).
- `work_inline(...)`: the same job with `task_after` (1 s): a call that declares Tasks gets its result
  in the first response when the job ends that soon.

Run it as a server process:

    python -m bench.app --stdio
    python -m bench.app --http --port 8123 [--tokens tokens.json]
    python -m bench.app --fastmcp [--http --port 8123]   (the same server on FastMCP 4)

With `BENCH_POLL_PARTS=1` the stdio server also serves section 19's tools (`bench.poll_parts`: a progress
poll by parts). With `BENCH_STARTED_FILE=path` a `work` job with a `mark` also appends the line `MARK TIME` to
that file when its function begins (`time.perf_counter()`, the system-wide monotonic clock on Linux), so a client
in another process learns it (section 3's pickup over stdio and HTTP).

Configuration comes from `HANDLES_*` (HANDLES_DATABASE_URL, HANDLES_DATA_DIR, HANDLES_SECRET_KEYS, ...).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult
from pydantic import BaseModel

from example_server.__main__ import FileTokenVerifier
from handles import Handles, HandlesConfig, JobContext, serve_stdio, streamable_http_app
from handles.server.handle_tools import JobTools
from handles.server.tool_shapes import ProgressOutput, ProgressView, ToolReply, to_call_tool_result
from handles.states import Status
from handles.store import JobRecord

STARTED: dict[str, float] = {}
"""`mark` -> `time.perf_counter()` when the job function began (in-process benchmarks only)."""

FINISHED: dict[str, float] = {}
"""`mark` -> `time.perf_counter()` just before the job function returned."""

_GATES: dict[str, asyncio.Event] = {}


def gate(mark: str) -> asyncio.Event:
    """An event a `work(mark=...)` job with `seconds < 0` waits on before it returns."""
    event = _GATES.get(mark)
    if event is None:
        event = _GATES[mark] = asyncio.Event()
    return event


class WorkResult(BaseModel):
    slept: float
    mark: str


class NoopResult(BaseModel):
    ok: bool


_STARTED_FILE = os.environ.get("BENCH_STARTED_FILE")


async def work(ctx: JobContext, seconds: float = 0.0, mark: str = "") -> WorkResult:
    """Sleep `seconds` and return; `seconds < 0` waits until the benchmark opens `gate(mark)`."""
    if mark:
        STARTED[mark] = time.perf_counter()
        if _STARTED_FILE:
            with open(_STARTED_FILE, "a") as started:
                started.write(f"{mark} {STARTED[mark]!r}\n")
    if seconds > 0:
        await asyncio.sleep(seconds)
    elif seconds < 0:
        await gate(mark).wait()
    if mark:
        FINISHED[mark] = time.perf_counter()
    return WorkResult(slept=seconds, mark=mark)


def noop() -> NoopResult:
    """Do nothing (the baseline of every ratio)."""
    return NoopResult(ok=True)


def progress_shaped_tool(jobs: Handles) -> Callable[[], Annotated[CallToolResult, ProgressOutput]]:
    """The tool `progress_shaped`: it runs no `handles` code when called and returns, prebuilt, the
    result `work_progress` gives for a running `work` job, made once here by the package's own parts
    (the same fields, guidance text and text content)."""
    tools = JobTools(jobs.specs["work"], jobs.service)  # no database needed
    now = datetime.now(UTC)
    running = JobRecord.model_construct(status=Status.WORKING.value, expires_at=now + timedelta(hours=6))
    content = ProgressOutput(
        job="work",
        status=Status.WORKING,
        status_message="Running.",
        progress=ProgressView(),
        attempts=1,
        created_at=now,
        updated_at=now,
        expires_at=running.expires_at,
        poll_after_ms=tools.spec.poll_after_ms,
        next=tools.next_step(running, []),
    ).model_dump(mode="json")
    result = to_call_tool_result(ToolReply(content))

    def progress_shaped() -> Annotated[CallToolResult, ProgressOutput]:
        """Return a prebuilt result shaped like `work_progress`'s (no handles code runs)."""
        return result

    return progress_shaped


def create_jobs(config: HandlesConfig | None = None) -> Handles:
    jobs = Handles(config)
    # poll_after 0.1 s: the Tasks face advertises pollIntervalMs=100 (the peer's default is 5 s).
    jobs.job(retention=timedelta(hours=6), poll_after=timedelta(milliseconds=100))(work)
    # The same job answering a declaring call inline when it ends within a second (section 6).
    jobs.job(
        name="work_inline",
        retention=timedelta(hours=6),
        poll_after=timedelta(milliseconds=100),
        task_after=timedelta(seconds=1),
    )(work)
    return jobs


def build_server(jobs: Handles, *, token_verifier: Any = None, auth: Any = None) -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer(
        "handles-bench",
        token_verifier=token_verifier,
        auth=auth,
        extensions=[jobs.tasks_extension()],
    )
    server.add_tool(noop, structured_output=True)
    server.add_tool(progress_shaped_tool(jobs), structured_output=True)
    jobs.bind(server)
    return server


def build_fastmcp_server(jobs: Handles, *, auth: Any = None) -> Any:
    """The same server on FastMCP 4: `noop` as a FastMCP tool, `work` bound by `jobs.bind`."""
    from fastmcp import FastMCP

    server = FastMCP("handles-bench", auth=auth)
    server.tool(noop)
    jobs.bind(server)
    return server


def time_progress_handler(path: Path) -> None:
    """Time `JobTools.progress` and `JobRepository.snapshot` inside this server process (wall and the
    thread's CPU, microseconds), written to `path` as JSON after every 100th call (bench profile)."""
    from handles.server.handle_tools import JobTools
    from handles.store.repository import JobRepository

    samples: dict[str, list[float]] = {
        "handler wall": [],
        "handler cpu": [],
        "snapshot wall": [],
        "snapshot cpu": [],
    }
    progress, snapshot = JobTools.progress, JobRepository.snapshot

    async def timed_progress(self: JobTools, principal: str, arguments: dict[str, Any]) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return await progress(self, principal, arguments)
        finally:
            samples["handler wall"].append((time.perf_counter() - wall) * 1e6)
            samples["handler cpu"].append((time.thread_time() - cpu) * 1e6)
            if len(samples["handler wall"]) % 100 == 0:
                path.write_text(json.dumps(samples))

    def timed_snapshot(self: JobRepository, job_id: str) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return snapshot(self, job_id)
        finally:
            samples["snapshot wall"].append((time.perf_counter() - wall) * 1e6)
            samples["snapshot cpu"].append((time.thread_time() - cpu) * 1e6)

    JobTools.progress = timed_progress  # type: ignore[method-assign]
    JobRepository.snapshot = timed_snapshot  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.app", description=__doc__)
    parser.add_argument("--stdio", action="store_true")
    parser.add_argument("--http", action="store_true")
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--tokens", type=Path, help="JSON file {token: principal}; requires bearer tokens")
    parser.add_argument("--fastmcp", action="store_true", help="serve from FastMCP 4 instead of MCPServer")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    handler_times = os.environ.get("BENCH_HANDLER_TIMES")
    if handler_times:  # bench profile: the progress handler timed inside this process
        time_progress_handler(Path(handler_times))
    switch = os.environ.get("BENCH_SWITCH_INTERVAL")
    if switch:  # an experiment knob: the GIL switch interval in seconds (CPython's default is 0.005)
        sys.setswitchinterval(float(switch))
    jobs = create_jobs()
    if os.environ.get("BENCH_NO_WRITE_LOCK"):  # A/B experiment: without the in-process SQLite writer lock
        import contextlib

        jobs.service.store.repo._write_lock = contextlib.nullcontext()
    if args.fastmcp:
        if args.tokens:
            raise SystemExit("--fastmcp serves without tokens")
        fastmcp_server = build_fastmcp_server(jobs)
        if not args.http:
            asyncio.run(serve_stdio(fastmcp_server, jobs))
            return
        _serve_uvicorn(streamable_http_app(fastmcp_server, jobs), args.port)
        return
    if not args.http:
        server = build_server(jobs)
        if os.environ.get("BENCH_POLL_PARTS"):  # section 19: a poll's parts as tools of their own
            from bench.poll_parts import add_poll_parts

            add_poll_parts(server, jobs)
        asyncio.run(serve_stdio(server, jobs))
        return
    options: dict[str, Any] = {}
    if args.tokens:
        base = f"http://127.0.0.1:{args.port}"
        options["token_verifier"] = FileTokenVerifier(json.loads(args.tokens.read_text()))
        options["auth"] = AuthSettings(
            issuer_url=base, resource_server_url=f"{base}/mcp", validate_token_resource=False
        )
    _serve_uvicorn(streamable_http_app(build_server(jobs, **options), jobs), args.port)


def _serve_uvicorn(app: Any, port: int) -> None:
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
