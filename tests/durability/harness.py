"""In-process harness for durability tests: a real SQLite file, a real MCPServer, the real mcp Client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from mcp import Client
from mcp.server.mcpserver import MCPServer

from handles import Handles, HandlesConfig

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
    """
    runtime = jobs.runtime
    tasks = [entry.task for entry in runtime._running.values() if entry.task is not None]
    tasks += runtime._loops + ([runtime._dispatcher] if runtime._dispatcher is not None else [])
    for entry in runtime._running.values():
        entry.lost = True
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    runtime._closed = True
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


class ServerProcess:
    """`python -m example_server --http` in a subprocess (on `framework`), which tests can kill -9 and restart."""

    def __init__(self, data_dir: Path, framework: str = "mcpserver", **env: str) -> None:
        import os

        from tests.support import framework_args, free_port

        self.port = free_port()
        self.framework_args = framework_args(framework)
        self.env = dict(os.environ)
        self.env.update(
            {
                "HANDLES_DATA_DIR": str(data_dir),
                "HANDLES_SECRET_KEYS": KEY,
                "HANDLES_LEASE_SECONDS": "1",
                "HANDLES_HEARTBEAT_SECONDS": "0.2",
                "HANDLES_SWEEP_SECONDS": "0.3",
                "HANDLES_STORE_POLL_SECONDS": "0.1",
            }
        )
        self.env.update(env)
        self.log = data_dir / "server.log"
        self.process: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        import subprocess
        import sys
        import time
        import urllib.request

        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "example_server",
                    "--http",
                    "--port",
                    str(self.port),
                    *self.framework_args,
                ],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {self.log.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health-probe", timeout=0.5)
            except OSError as exc:
                if getattr(exc, "code", None) == 404:
                    return
                time.sleep(0.1)
                continue
            return
        raise RuntimeError("server did not start listening")

    def kill(self) -> None:
        import signal

        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except Exception:
                self.kill()
