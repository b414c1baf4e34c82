"""In-process harness for durability tests: a real SQLite file, a real MCPServer, the real mcp Client."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from mcp import Client
from mcp.server.mcpserver import MCPServer

from handles import Handles, HandlesConfig
from handles.store import JobRecord, JobRepository
from tests.harness.process import ServerProcess, free_port, python_module
from tests.support import framework_args

KEY = "durability-test-key-" + "k" * 32


class FakeClock:
    """A clock tests move by hand, for retention without sleeping."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


def config(tmp: Path, **overrides: Any) -> HandlesConfig:
    base = HandlesConfig(
        data_dir=tmp,
        secret_keys=(KEY,),
        lease_seconds=2.0,
        heartbeat_seconds=0.2,
        sweep_interval_seconds=3600,  # tests sweep by hand
        store_poll_seconds=0.1,
        cancel_grace_seconds=0.5,
        progress_flush_seconds=0.05,
        drain_seconds=1.0,  # tests of the drain itself set their own
    )
    return replace(base, **overrides)


async def crash(jobs: Handles) -> None:
    """The process of `jobs` dies (as by kill -9): its runs stop where they are and nothing more is written.

    Its leases stay in the store until they run out; another node's sweep then settles its jobs.
    A step executing on a worker thread finishes in the background, as it would not after a real crash.
    Its background tasks die too: the dispatcher's claim is shielded from the dispatcher's own cancel
    (a drain must run what a claim took), and left alone it would start jobs on the dead runtime.
    """
    runtime = jobs.runtime
    runtime._closed = True
    tasks = [entry.task for entry in runtime._running.values() if entry.task is not None]
    tasks += runtime._loops + ([runtime._dispatcher] if runtime._dispatcher is not None else [])
    tasks += list(runtime._background)
    for entry in runtime._running.values():
        entry.lost = True
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    jobs.service.store.repo.dispose()


@dataclass
class Rig:
    jobs: Handles
    client: Client

    async def call(self, tool: str, **arguments: Any) -> tuple[dict[str, Any], bool]:
        result = await self.client.call_tool(tool, arguments)
        if result.structured_content is not None:
            return result.structured_content, bool(result.is_error)
        return json.loads(result.content[0].text), bool(result.is_error)  # type: ignore[union-attr]

    async def ok(self, tool: str, **arguments: Any) -> dict[str, Any]:
        body, is_error = await self.call(tool, **arguments)
        assert not is_error, body
        return body


@asynccontextmanager
async def rig(jobs: Handles, declare: Callable[[Handles], None] | None = None) -> AsyncIterator[Rig]:
    if declare is not None:
        declare(jobs)
    server: MCPServer[Any] = MCPServer("durability")
    jobs.bind(server)
    try:
        async with Client(server) as client:
            yield Rig(jobs, client)
    finally:
        await jobs.aclose()


def example_node(data_dir: Path, framework: str = "mcpserver", **env: str) -> ServerProcess:
    """`python -m example_server --http` (on `framework`) with short leases and sweeps, which tests can
    kill -9 and restart on the same port; `env` adds or overrides settings."""
    return http_node("example_server", data_dir, "--http", *framework_args(framework), **env)


def http_node(module: str, data_dir: Path, *args: str, **env: str) -> ServerProcess:
    """`python -m <module> <args> --port N` serving HTTP on `data_dir`, with short leases and sweeps, which
    tests can kill -9 and restart on the same port; `env` adds or overrides settings."""
    port = free_port()
    settings = dict(os.environ)
    settings.update(
        {
            "HANDLES_DATA_DIR": str(data_dir),
            "HANDLES_SECRET_KEYS": KEY,
            "HANDLES_LEASE_SECONDS": "1",
            "HANDLES_HEARTBEAT_SECONDS": "0.2",
            "HANDLES_SWEEP_SECONDS": "0.3",
            "HANDLES_STORE_POLL_SECONDS": "0.1",
        }
    )
    settings.update(env)
    return ServerProcess(
        python_module(module, *args, "--port", str(port)),
        settings,
        data_dir / "server.log",
        port,
        ready="http",
        start_timeout=20,
        stop_timeout=10,
        append_log=True,
    )


def stored_jobs(data_dir: Path, *handles: str) -> list[JobRecord]:
    """The stored rows of the jobs behind `handles` (signed with `KEY`), read from the SQLite file in
    `data_dir` once its server has stopped."""
    from tests.runtime.support import job_id_of

    repo = JobRepository(f"sqlite:///{(data_dir / 'handles.db').as_posix()}")
    try:
        found = [repo.get(job_id_of(handle)) for handle in handles]
    finally:
        repo.dispose()
    assert all(job is not None for job in found), "a job is missing from the store"
    return [job for job in found if job is not None]
