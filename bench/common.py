"""Shared pieces of the benchmark sections: statistics, tables, the environment, server processes, clients."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import gc
import importlib.metadata
import json
import math
import os
import platform
import secrets
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO_ROOT / "bench"
DEFAULT_POSTGRES_URL = "postgresql+psycopg://root@127.0.0.1:5432/test"
SIGNING_KEY = secrets.token_urlsafe(48)


# -- options -----------------------------------------------------------------------------


@dataclass
class Options:
    quick: bool = False
    peer: bool = True
    postgres_url: str = DEFAULT_POSTGRES_URL
    work_dir: Path = Path("/tmp")
    command: str = ""
    verbose: bool = False

    def n(self, full: int, quick: int) -> int:
        return quick if self.quick else full

    def section_command(self, section: str) -> str:
        return f"python bench/run.py --only {section}" + (" --quick" if self.quick else "")


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- statistics --------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of already sorted values."""
    if not sorted_values:
        return math.nan
    if len(sorted_values) == 1:
        return sorted_values[0]
    rank = (len(sorted_values) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low)


@dataclass(frozen=True)
class Stats:
    """Latency statistics of samples given in seconds; reported in milliseconds."""

    n: int
    p50: float
    p90: float
    p99: float
    mean: float
    minimum: float
    maximum: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stats:
        values = sorted(samples)
        if not values:
            return cls(0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
        return cls(
            n=len(values),
            p50=percentile(values, 50) * 1000,
            p90=percentile(values, 90) * 1000,
            p99=percentile(values, 99) * 1000,
            mean=sum(values) / len(values) * 1000,
            minimum=values[0] * 1000,
            maximum=values[-1] * 1000,
        )

    def as_dict(self) -> dict[str, float]:
        return {
            "n": self.n,
            "p50_ms": self.p50,
            "p90_ms": self.p90,
            "p99_ms": self.p99,
            "mean_ms": self.mean,
            "min_ms": self.minimum,
            "max_ms": self.maximum,
        }


def ms(value: float) -> str:
    """A millisecond figure with three significant digits."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def ratio(value: float, base: float) -> str:
    if base is None or value is None or math.isnan(base) or math.isnan(value) or base == 0:
        return "n/a"
    return f"{value / base:.2f}x"


def verdict(ok: bool | None) -> str:
    if ok is None:
        return "n/a"
    return "yes" if ok else "**no**"


# -- tables ------------------------------------------------------------------------------


@dataclass
class Table:
    section: str
    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    command: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def markdown(self) -> str:
        lines = [f"### {self.title}", ""]
        if self.command:
            lines += [f"Command: `{self.command}`", ""]
        lines.append("| " + " | ".join(self.columns) + " |")
        lines.append("|" + "|".join("---" for _ in self.columns) + "|")
        for row in self.rows:
            lines.append("| " + " | ".join(str(cell) for cell in row) + " |")
        if self.notes:
            lines.append("")
            lines += [f"- {note}" for note in self.notes]
        return "\n".join(lines) + "\n"

    def as_dict(self) -> dict[str, Any]:
        return {
            "section": self.section,
            "title": self.title,
            "command": self.command,
            "columns": self.columns,
            "rows": [[str(c) for c in row] for row in self.rows],
            "notes": self.notes,
            "data": self.data,
        }


# -- the environment ---------------------------------------------------------------------


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _peer_versions() -> dict[str, str]:
    python = BENCH_DIR / ".peer-venv" / "bin" / "python"
    if not python.exists():
        return {}
    code = (
        "import importlib.metadata as m, json; print(json.dumps({d: m.version(d) for d in "
        "('fastmcp-slim', 'fastmcp-tasks', 'pydocket', 'mcp')}))"
    )
    try:
        out = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, timeout=30, check=True
        )
        return {f"peer {k}": v for k, v in json.loads(out.stdout).items()}
    except Exception:
        return {}


def postgres_version(url: str) -> str:
    try:
        from sqlalchemy import create_engine, text

        engine = create_engine(url, connect_args={"connect_timeout": 3})
        try:
            with engine.connect() as connection:
                return str(connection.execute(text("show server_version")).scalar())
        finally:
            engine.dispose()
    except Exception as exc:
        return f"unreachable ({exc.__class__.__name__})"


def environment(options: Options) -> dict[str, Any]:
    try:
        load = os.getloadavg()
    except OSError:
        load = (math.nan, math.nan, math.nan)
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    info: dict[str, Any] = {
        "command": options.command,
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "cpus": os.cpu_count(),
        "cpu model": model,
        "load average (1/5/15 min) at start": " / ".join(f"{x:.2f}" for x in load),
        "python": sys.version.split()[0] + " (" + platform.python_implementation() + ")",
        "platform": platform.platform(),
        "sqlite": sqlite3.sqlite_version,
        "postgresql": postgres_version(options.postgres_url),
    }
    for dist in (
        "mcp-handles",
        "mcp",
        "mcp-types",
        "pydantic",
        "sqlalchemy",
        "sqlmodel",
        "itsdangerous",
        "starlette",
        "uvicorn",
        "httpx2",
        "psycopg",
        "anyio",
    ):
        info[dist] = _version(dist)
    info.update(_peer_versions())
    return info


def environment_markdown(info: dict[str, Any]) -> str:
    lines = ["| | |", "|---|---|"]
    for key, value in info.items():
        shown = f"`{value}`" if key == "command" else str(value)
        lines.append(f"| {key} | {shown} |")
    return "\n".join(lines) + "\n"


# -- processes ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def handles_env(data_dir: Path, database_url: str = "", **extra: str) -> dict[str, str]:
    """Environment of a `bench.app` server process."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", str(data_dir)),
        "PYTHONPATH": str(REPO_ROOT),
        "PYTHONUNBUFFERED": "1",
        "HANDLES_DATA_DIR": str(data_dir),
        "HANDLES_SECRET_KEYS": SIGNING_KEY,
    }
    if database_url:
        env["HANDLES_DATABASE_URL"] = database_url
    env.update(extra)
    return env


def read_status_kb(pid: int, field_name: str) -> int | None:
    """A `VmRSS` / `VmHWM` figure (kB) of a process, from /proc."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks
    except (OSError, IndexError, ValueError):
        return None


@dataclass
class ServerProcess:
    """A server process on 127.0.0.1 (the `handles` bench server or the peer), stopped by its own pid."""

    args: list[str]
    env: dict[str, str]
    log_path: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 60.0) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as out:
            self.process = subprocess.Popen(
                self.args,
                env=self.env,
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited early: {self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"server did not answer within {timeout} s: {self.log()}")

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)
        self.process = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""


def handles_http_server(
    data_dir: Path, *, database_url: str = "", tokens: Path | None = None, fastmcp: bool = False, **env: str
) -> ServerProcess:
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "bench.app",
        "--http",
        "--port",
        str(port),
        *(["--fastmcp"] if fastmcp else []),
    ]
    if tokens is not None:
        args += ["--tokens", str(tokens)]
    return ServerProcess(
        args=args,
        env=handles_env(data_dir, database_url, **env),
        log_path=data_dir / f"server-{port}.log",
        port=port,
    )


# -- clients -----------------------------------------------------------------------------


@asynccontextmanager
async def client(target: Any, *, token: str | None = None, tasks: bool = True) -> AsyncIterator[Any]:
    """The official `mcp.Client` on `target` (an `MCPServer`, stdio parameters, or a URL), declaring Tasks."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from handles.client import TasksClientExtension

    extensions = [TasksClientExtension()] if tasks else None
    async with AsyncExitStack() as stack:
        if isinstance(target, str) and token is not None:
            import httpx2

            http = await stack.enter_async_context(
                httpx2.AsyncClient(
                    headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(60, read=120)
                )
            )
            mcp_client = Client(streamable_http_client(target, http_client=http), extensions=extensions)
        else:
            mcp_client = Client(target, extensions=extensions)
        await stack.enter_async_context(mcp_client)
        yield mcp_client


async def timed(call: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = await call()
    return time.perf_counter() - start, value


def quiet_gc() -> None:
    gc.collect()


def postgres_schema_url(base: str, schema: str) -> str:
    separator = "&" if "?" in base else "?"
    return f"{base}{separator}options={quote(f'-csearch_path={schema}')}"


@contextlib.contextmanager
def postgres_schema(base: str, label: str) -> Any:
    """A fresh PostgreSQL schema for one benchmark (dropped afterwards); yields its URL or None."""
    from sqlalchemy import create_engine, text

    try:
        engine = create_engine(base, connect_args={"connect_timeout": 3})
        with engine.connect() as connection:
            connection.execute(text("select 1"))
    except Exception as exc:
        log(f"PostgreSQL unreachable at {base}: {exc.__class__.__name__}")
        yield None
        return
    schema = f"bench_{label}_{os.getpid()}_{secrets.token_hex(3)}"
    with engine.begin() as connection:
        connection.execute(text(f'create schema "{schema}"'))
    try:
        yield postgres_schema_url(base, schema)
    finally:
        with engine.begin() as connection:
            connection.execute(text(f'drop schema if exists "{schema}" cascade'))
        engine.dispose()


async def sleep_ms(value: float) -> None:
    await asyncio.sleep(value / 1000)


# -- in-process servers ------------------------------------------------------------------


def handles_config(data_dir: Path, database_url: str = "", **overrides: Any) -> Any:
    """A `HandlesConfig` for the bench server (options this version does not know are left out)."""
    import dataclasses

    from handles import HandlesConfig

    known = {f.name for f in dataclasses.fields(HandlesConfig)}
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "secret_keys": (SIGNING_KEY,),
        "database_url": database_url,
    }
    if database_url and not database_url.startswith("sqlite"):
        values["auto_migrate"] = True
    values.update(overrides)
    return HandlesConfig(**{k: v for k, v in values.items() if k in known})


@asynccontextmanager
async def inprocess(
    data_dir: Path, database_url: str = "", **overrides: Any
) -> AsyncIterator[tuple[Any, Any]]:
    """(jobs, connected client) for the bench server built in this process."""
    from bench.app import build_server, create_jobs

    jobs = create_jobs(handles_config(data_dir, database_url, **overrides))
    server = build_server(jobs)
    async with jobs.running(), client(server) as connected:
        yield jobs, connected


async def structured(c: Any, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Call a tool; its structured result, or an exception for an error result."""
    result = await c.call_tool(tool, arguments)
    if result.is_error or result.structured_content is None:
        raise RuntimeError(f"{tool} failed: {result.content}")
    data: dict[str, Any] = result.structured_content
    return data
