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
import random
import secrets
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.harness.process import ServerProcess, free_port, server_env

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

    def table(self, section: str, title: str, columns: list[str], **fields: Any) -> Table:
        """A section's result table, carrying the command that measures that section alone."""
        return Table(section, title, columns, command=self.section_command(section), **fields)


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_alone(
    run: Callable[[Options], Awaitable[list[Table]]], command: str, *, with_data: bool = False
) -> None:
    """Run one section as a script of its own (`command` says how), in a scratch directory removed afterwards,
    and print its tables (and, `with_data`, each table's figures as JSON)."""
    import logging
    import tempfile

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="handles-bench-") as work_dir:
        options = Options(work_dir=Path(work_dir), command=command)
        for table in asyncio.run(run(options)):
            print(table.markdown())
            if with_data:
                print(json.dumps(table.data, indent=2))


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

    def cells(self, *names: str) -> list[str]:
        """The named figures ("p50", "p99", "maximum", ...) as millisecond text for a table's row."""
        return [ms(getattr(self, name)) for name in names]

    @property
    def p50_p99(self) -> str:
        """The "p50 / p99" cell of a table, in milliseconds."""
        return " / ".join(self.cells("p50", "p99"))

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


def handles_env(data_dir: Path, database_url: str = "", **extra: str) -> dict[str, str]:
    """Environment of a `bench.app` server process."""
    settings = {"HANDLES_SECRET_KEYS": SIGNING_KEY}
    if database_url:
        settings["HANDLES_DATABASE_URL"] = database_url
    return server_env(data_dir, **(settings | extra))


def handles_stdio_server(data_dir: Path, *, database_url: str = "", fastmcp: bool = False, **env: str) -> Any:
    """The parameters of a `python -m bench.app --stdio` server process (the official client's
    `StdioServerParameters`), its data in `data_dir`, with `env` added to its environment."""
    from mcp import StdioServerParameters

    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "bench.app", "--stdio", *(["--fastmcp"] if fastmcp else [])],
        env=handles_env(data_dir, database_url, **env),
        cwd=REPO_ROOT,
    )


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
        args,
        handles_env(data_dir, database_url, **env),
        data_dir / f"server-{port}.log",
        port,
        start_timeout=60,
    )


# -- clients -----------------------------------------------------------------------------


@asynccontextmanager
async def client(target: Any, *, token: str | None = None, tasks: bool = True) -> AsyncIterator[Any]:
    """The official `mcp.Client` on `target` (an `MCPServer`, stdio parameters, or a URL), declaring Tasks."""
    import httpx2
    from mcp import Client

    from handles.client import TasksClientExtension
    from tests.harness.client import mcp_over_http

    extensions = [TasksClientExtension()] if tasks else None
    if isinstance(target, str) and token is not None:
        opened = mcp_over_http(target, token, timeout=httpx2.Timeout(60, read=120), extensions=extensions)
    else:
        opened = Client(target, extensions=extensions)
    async with opened as mcp_client:
        yield mcp_client


@asynccontextmanager
async def served(
    transport: str,
    data_dir: Path,
    *,
    database_url: str = "",
    fastmcp: bool = False,
    tasks: bool = True,
    **env: str,
) -> AsyncIterator[Any]:
    """A client of `python -m bench.app` in a process of its own over `transport` ("stdio" or "http")."""
    if transport == "stdio":
        params = handles_stdio_server(data_dir, database_url=database_url, fastmcp=fastmcp, **env)
        async with client(params, tasks=tasks) as c:
            yield c
        return
    process = handles_http_server(data_dir, database_url=database_url, fastmcp=fastmcp, **env).start()
    try:
        async with client(process.url, tasks=tasks) as c:
            yield c
    finally:
        process.stop()


async def timed(call: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = await call()
    return time.perf_counter() - start, value


async def shuffled_rounds(
    calls: dict[str, Callable[[], Awaitable[Any]]],
    rounds: int,
    warmup: int,
    after_call: Callable[[], Awaitable[Any]] | None = None,
) -> dict[str, list[float]]:
    """Each call once a round, in a fresh random order each round, for `warmup` untimed rounds and then
    `rounds` timed ones; `after_call` runs untimed after every call (to let the work a call started end
    before the next call is timed). Samples in seconds, by call."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    order = list(calls)
    for index in range(warmup + rounds):
        random.shuffle(order)
        for name in order:
            elapsed, _ = await timed(calls[name])
            if index >= warmup:
                samples[name].append(elapsed)
            if after_call is not None:
                await after_call()
    return samples


def quiet_gc() -> None:
    gc.collect()


@contextlib.contextmanager
def postgres_schema(base: str, label: str) -> Iterator[str | None]:
    """A fresh PostgreSQL schema for one benchmark (dropped afterwards); yields its URL, or None when
    PostgreSQL is unreachable."""
    from tests.harness.postgres import fresh_schema, unreachable

    exc = unreachable(base)
    if exc is not None:
        log(f"PostgreSQL unreachable at {base}: {exc.__class__.__name__}")
        yield None
        return
    with fresh_schema(base, f"bench_{label}_{os.getpid()}") as url:
        yield url


@contextlib.contextmanager
def sqlite_and_postgres(
    options: Options, label: str, table: Table, *, sqlite_url: bool = False
) -> Iterator[Iterator[tuple[str, str, Path]]]:
    """The stores a section measures on, each as (name, database URL, a fresh data directory), each given
    once garbage is collected: the SQLite file (URL "": the default in the data directory; with
    `sqlite_url`, that file's URL spelled out) and PostgreSQL in a fresh schema (dropped afterwards). When
    PostgreSQL is unreachable, `table` gets a row saying so instead."""
    with postgres_schema(options.postgres_url, label) as pg_url:
        yield _stores(options, label, table, pg_url, sqlite_url=sqlite_url)


def _stores(
    options: Options, label: str, table: Table, pg_url: str | None, *, sqlite_url: bool
) -> Iterator[tuple[str, str, Path]]:
    import tempfile

    for name, url in (("SQLite file", ""), ("PostgreSQL", pg_url)):
        if url is None:
            table.rows.append([name, "unreachable", *(["n/a"] * (len(table.columns) - 2))])
            continue
        data_dir = Path(tempfile.mkdtemp(prefix=f"{label}-", dir=options.work_dir))
        if sqlite_url and not url:
            url = f"sqlite:///{(data_dir / 'handles.db').as_posix()}"
        quiet_gc()
        yield name, url, data_dir


def seeded_to(url: str, size: int, what: str) -> float:
    """Seed completed jobs into the store at `url` until it holds `size` of them (`what` names the step in
    the log); the seconds the seeding took, 0 when the store already held as many."""
    from tests.harness.seed import count_jobs, seed_jobs

    have = count_jobs(url)
    log(f"{what}, seeding to {size} jobs")
    return seed_jobs(url, size - have) if size > have else 0.0


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
    async with inprocess_with(None, data_dir, database_url, **overrides) as served:
        yield served


@asynccontextmanager
async def inprocess_with(
    job: Callable[..., Any] | None, data_dir: Path, database_url: str = "", **overrides: Any
) -> AsyncIterator[tuple[Any, Any]]:
    """`inprocess`, with the job function `job` registered besides the bench server's own (kept an hour,
    polled every 100 ms), for a section that measures a job of its own and leaves the others' server
    unchanged."""
    from bench.app import build_server, create_jobs

    jobs = create_jobs(handles_config(data_dir, database_url, **overrides))
    if job is not None:
        jobs.job(retention=_dt.timedelta(hours=1), poll_after=_dt.timedelta(milliseconds=100))(job)
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
