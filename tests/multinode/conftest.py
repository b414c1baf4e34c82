"""Several real processes on one PostgreSQL database, in a schema of their own."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from sqlalchemy import create_engine, make_url, text

from handles.store import migrate
from tests.support import free_port

KEY = "multinode-test-key-" + "m" * 32
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pg_url(postgres_url: str) -> Iterator[str]:
    """A fresh schema for one test, upgraded with the real `handles db upgrade` command."""
    base = postgres_url.split("?")[0]
    schema = f"handles_multinode_{secrets.token_hex(4)}"
    engine = create_engine(base)
    with engine.begin() as connection:
        connection.execute(text(f'create schema "{schema}"'))
    url = f"{base}?options={quote(f'-csearch_path={schema}')}"
    upgraded = subprocess.run(
        [sys.executable, "-m", "handles.cli", "db", "upgrade", "--database-url", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert upgraded.returncode == 0, upgraded.stderr
    assert f"-> {migrate.head_revision()}" in upgraded.stdout
    try:
        yield url
    finally:
        with engine.begin() as connection:
            connection.execute(text(f'drop schema if exists "{schema}" cascade'))
        engine.dispose()


def node_env(tmp: Path, database_url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "HANDLES_DATABASE_URL": database_url,
            "HANDLES_SECRET_KEYS": KEY,
            "HANDLES_DATA_DIR": str(tmp),
            "HANDLES_LEASE_SECONDS": "1.5",
            "HANDLES_HEARTBEAT_SECONDS": "0.3",
            "HANDLES_SWEEP_SECONDS": "0.3",
            "HANDLES_STORE_POLL_SECONDS": "1",
            "PYTHONPATH": str(ROOT),
        }
    )
    env.update(extra)
    return env


class Node:
    """One server node (`python -m example_server --http`) or worker (`handles worker`)."""

    def __init__(
        self, name: str, args: list[str], env: dict[str, str], log: Path, port: int | None = None
    ) -> None:
        self.name, self.args, self.env, self.log, self.port = name, args, env, log, port
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> Node:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                self.args, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT
            )
        if self.port is not None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"{self.name} exited:\n{self.log.read_text()[-3000:]}")
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection(("127.0.0.1", self.port), timeout=0.2),
                ):
                    return self
                time.sleep(0.1)
            raise RuntimeError(f"{self.name} never listened")
        return self

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


class Cluster:
    def __init__(self, tmp: Path, database_url: str) -> None:
        self.tmp, self.database_url = tmp, database_url
        self.nodes: list[Node] = []

    def server(self, name: str, **env: str) -> Node:
        port = free_port()
        node = Node(
            name,
            [sys.executable, "-m", "example_server", "--http", "--port", str(port)],
            node_env(self.tmp, self.database_url, **env),
            self.tmp / f"{name}.log",
            port,
        )
        self.nodes.append(node)
        return node.start()

    def worker(self, name: str, app: str, **env: str) -> Node:
        node = Node(
            name,
            [sys.executable, "-m", "handles.cli", "worker", "--app", app],
            node_env(self.tmp, self.database_url, **env),
            self.tmp / f"{name}.log",
        )
        self.nodes.append(node)
        return node.start()

    def close(self) -> None:
        for node in self.nodes:
            node.stop()


@pytest.fixture
def cluster(tmp_path: Path, pg_url: str) -> Iterator[Cluster]:
    nodes = Cluster(tmp_path, pg_url)
    try:
        yield nodes
    finally:
        nodes.close()


class TcpProxy:
    """A TCP relay in front of PostgreSQL, so a test can cut the database off and bring it back."""

    def __init__(self, target_port: int = 5432) -> None:
        self.port = free_port()
        self.target = target_port
        self._loop = asyncio.new_event_loop()
        self._server: Any = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    def url(self, database_url: str) -> str:
        return (
            make_url(database_url).set(host="127.0.0.1", port=self.port).render_as_string(hide_password=False)
        )

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=10)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except Exception:
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        self._writers.update({writer, upstream_writer})
        await asyncio.gather(self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer))

    def up(self) -> None:
        async def start() -> None:
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

        self._run(start())

    def down(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
                await self._server.wait_closed()
                self._server = None
            for writer in list(self._writers):
                writer.transport.abort()
            self._writers.clear()

        self._run(stop())

    def close(self) -> None:
        self.down()
        self._loop.call_soon_threadsafe(self._loop.stop)
