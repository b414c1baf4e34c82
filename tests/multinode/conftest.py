"""Several real processes on one PostgreSQL database, in a schema of their own."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from handles.store import migrate
from tests.harness.postgres import fresh_schema
from tests.harness.process import ServerProcess, free_port, python_module

KEY = "multinode-test-key-" + "m" * 32
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pg_url(postgres_url: str) -> Iterator[str]:
    """A fresh schema for one test, upgraded with the real `handles db upgrade` command."""
    with fresh_schema(postgres_url.split("?")[0], "handles_multinode") as url:
        upgraded = subprocess.run(
            [sys.executable, "-m", "handles.cli", "db", "upgrade", "--database-url", url],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert upgraded.returncode == 0, upgraded.stderr
        assert f"-> {migrate.head_revision()}" in upgraded.stdout
        yield url


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


class Cluster:
    """Server nodes (`python -m example_server --http`) and workers (`handles worker`) on one database."""

    def __init__(self, tmp: Path, database_url: str) -> None:
        self.tmp, self.database_url = tmp, database_url
        self.nodes: list[ServerProcess] = []

    def _start(
        self,
        name: str,
        args: list[str],
        port: int | None,
        env: dict[str, str],
        ready_line: str | None = None,
    ) -> ServerProcess:
        node = ServerProcess(
            args,
            node_env(self.tmp, self.database_url, **env),
            self.tmp / f"{name}.log",
            port,
            name=name,
            ready_line=ready_line,
            stop_timeout=10,
            append_log=True,
        )
        self.nodes.append(node)
        return node.start()

    def server(self, name: str, *args: str, **env: str) -> ServerProcess:
        """An example server node, with `args` added to its command line."""
        port = free_port()
        command = python_module("example_server", "--http", "--port", str(port), *args)
        return self._start(name, command, port, env)

    def worker(self, name: str, app: str, **env: str) -> ServerProcess:
        """A `handles worker`, returned once it runs jobs (it listens on no port: its log says so). Jobs
        started before every worker runs would all go to whichever came up first."""
        args = python_module("handles.cli", "worker", "--app", app)
        return self._start(name, args, None, env, ready_line=" running jobs ")

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
