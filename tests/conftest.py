"""Shared fixtures: the async backend, signing keys, databases (SQLite and PostgreSQL), example servers.

Async tests run on anyio's pytest plugin (`anyio_mode = "auto"` in pyproject.toml).
PostgreSQL is reached at `HANDLES_TEST_POSTGRES_URL` (default
`postgresql+psycopg://postgres@127.0.0.1:5432/test`); each run works in a schema of
its own. When PostgreSQL is unreachable its tests skip, unless `CI` is set: then
they fail.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from example_server.server import build_fastmcp_server, build_server, create_jobs
from handles.tool_layout import ToolLayout
from tests.harness.database import own_connection
from tests.harness.postgres import fresh_schema, unreachable
from tests.support import (
    DRAIN_SECONDS,
    FRAMEWORKS,
    JOB_SECONDS,
    LOCAL_PRINCIPAL,
    TOKENS,
    TRANSPORTS,
    Connected,
    HttpExampleServer,
    InProcessExample,
    ToolClient,
    connect,
    example_env,
    handles_config,
    new_key,
    sdk_server_of,
    stdio_params,
    token_of,
)

DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session", autouse=True)
def _example_job_seconds() -> Iterator[None]:
    """In-process example jobs read EXAMPLE_JOB_SECONDS when they run: keep them short."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EXAMPLE_JOB_SECONDS", str(JOB_SECONDS))
        patch.setenv("HANDLES_DRAIN_SECONDS", str(DRAIN_SECONDS))
        patch.delenv("HANDLES_DATABASE_URL", raising=False)
        yield


@pytest.fixture(scope="session")
def signing_key() -> str:
    return new_key()


# -- databases ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A PostgreSQL URL whose search_path is a schema of this run alone; dropped at the end."""
    base = os.environ.get("HANDLES_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    exc = unreachable(base)
    if exc is not None:
        message = f"PostgreSQL is unreachable at {base}: {exc.__class__.__name__}: {exc}"
        if os.environ.get("CI"):
            pytest.fail(f"{message} (CI is set, so the PostgreSQL tests must run)", pytrace=False)
        pytest.skip(message)
    with fresh_schema(base, f"handles_test_{os.getpid()}") as url:
        yield url


def _truncate_postgres(url: str) -> None:
    with own_connection(url) as connection:
        tables = connection.execute(
            # Keep the migration version table: the schema stays at its revision, only rows go.
            text(
                "select tablename from pg_tables where schemaname = current_schema() "
                "and tablename <> 'handles_alembic_version'"
            )
        ).scalars()
        names = ", ".join(f'"{name}"' for name in tables)
        if names:
            connection.execute(text(f"truncate {names} cascade"))


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database, once on an SQLite file and once on PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{(tmp_path / 'store.db').as_posix()}"
        return
    url: str = request.getfixturevalue("postgres_url")
    _truncate_postgres(url)
    try:
        yield url
    finally:
        _truncate_postgres(url)


# -- the example server in-process ------------------------------------------------------


@pytest.fixture
async def inprocess_example(tmp_path: Path, signing_key: str) -> AsyncIterator[InProcessExample]:
    jobs = create_jobs(handles_config(tmp_path / "data", [signing_key]))
    try:
        yield InProcessExample(jobs, build_server(jobs), signing_key, tmp_path / "data")
    finally:
        await jobs.aclose()


# -- the example server over HTTP (one process per session) ------------------------------


@pytest.fixture(scope="session")
def http_example(tmp_path_factory: pytest.TempPathFactory, signing_key: str) -> Iterator[HttpExampleServer]:
    """Unauthenticated Streamable HTTP example server: every request is the local principal."""
    with HttpExampleServer(tmp_path_factory.mktemp("http-example"), [signing_key]).running() as server:
        yield server


@pytest.fixture(scope="session")
def http_auth_example(
    tmp_path_factory: pytest.TempPathFactory, signing_key: str
) -> Iterator[HttpExampleServer]:
    """Streamable HTTP example server that requires one of `TOKENS` as a bearer token."""
    with HttpExampleServer(
        tmp_path_factory.mktemp("http-auth-example"), [signing_key], TOKENS
    ).running() as server:
        yield server


@pytest.fixture(scope="session")
def fastmcp_http_auth_example(
    tmp_path_factory: pytest.TempPathFactory, signing_key: str
) -> Iterator[HttpExampleServer]:
    """The same, served by FastMCP 4 (`--fastmcp`), its tokens verified by FastMCP's authentication."""
    with HttpExampleServer(
        tmp_path_factory.mktemp("fastmcp-auth-example"), [signing_key], TOKENS, framework="fastmcp"
    ).running() as server:
        yield server


@pytest.fixture(scope="session")
def fastmcp_http_example(
    tmp_path_factory: pytest.TempPathFactory, signing_key: str
) -> Iterator[HttpExampleServer]:
    """Unauthenticated Streamable HTTP example server on FastMCP 4 (`--fastmcp`)."""
    with HttpExampleServer(
        tmp_path_factory.mktemp("fastmcp-example"), [signing_key], framework="fastmcp"
    ).running() as server:
        yield server


@pytest.fixture(scope="session")
def fastmcp_http_compact_example(
    tmp_path_factory: pytest.TempPathFactory, signing_key: str
) -> Iterator[HttpExampleServer]:
    """Unauthenticated Streamable HTTP example server on FastMCP 4, in the compact tool layout."""
    with HttpExampleServer(
        tmp_path_factory.mktemp("fastmcp-compact"), [signing_key], layout="compact", framework="fastmcp"
    ).running() as server:
        yield server


# -- one client fixture, three transports ------------------------------------------------------


@pytest.fixture(scope="session")
async def stdio_example(
    tmp_path_factory: pytest.TempPathFactory, signing_key: str
) -> AsyncIterator[ToolClient]:
    """One `python -m example_server` over stdio for the session (tests that restart it start their own)."""
    params = stdio_params(example_env(tmp_path_factory.mktemp("stdio-example"), [signing_key]))
    async with connect(params, forbidden=[signing_key]) as client:
        yield client


@pytest.fixture(scope="session")
async def stdio_compact_example(
    tmp_path_factory: pytest.TempPathFactory, signing_key: str
) -> AsyncIterator[ToolClient]:
    """One `python -m example_server --layout compact` over stdio for the session."""
    params = stdio_params(example_env(tmp_path_factory.mktemp("stdio-compact"), [signing_key]), "compact")
    async with connect(params, forbidden=[signing_key]) as client:
        yield client


@pytest.fixture(scope="session")
def http_compact_example(
    tmp_path_factory: pytest.TempPathFactory, signing_key: str
) -> Iterator[HttpExampleServer]:
    """Unauthenticated Streamable HTTP example server in the compact tool layout."""
    with HttpExampleServer(
        tmp_path_factory.mktemp("http-compact"), [signing_key], layout="compact"
    ).running() as server:
        yield server


@pytest.fixture
def layout() -> ToolLayout:
    """The tool layout of the `example` server; a test module overrides it to run in both layouts."""
    return "per_job"


@pytest.fixture(params=TRANSPORTS)
async def example(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    signing_key: str,
    layout: ToolLayout,
    stdio_example: ToolClient,
    stdio_compact_example: ToolClient,
) -> AsyncIterator[Connected]:
    """The example server in `layout` through the official client: in-process, over stdio, over Streamable
    HTTP, and served by FastMCP 4 in-process and over Streamable HTTP (`fastmcp-inprocess`, `fastmcp-http`)."""
    transport: str = request.param
    compact = layout == "compact"
    if transport in ("inprocess", "fastmcp-inprocess"):
        jobs = create_jobs(handles_config(tmp_path / "data", [signing_key]))
        server = (
            build_server(jobs, layout=layout)
            if transport == "inprocess"
            else sdk_server_of(build_fastmcp_server(jobs, layout=layout))
        )
        try:
            async with connect(server, forbidden=[signing_key]) as client:
                yield Connected(client, transport, signing_key, LOCAL_PRINCIPAL, layout)
        finally:
            await jobs.aclose()
    elif transport == "stdio":
        # Both stdio servers are session fixtures (an async fixture cannot be requested lazily).
        stdio = stdio_compact_example if compact else stdio_example
        yield Connected(stdio, transport, signing_key, LOCAL_PRINCIPAL, layout)
    else:
        prefix = "fastmcp_" if transport == "fastmcp-http" else ""
        http: HttpExampleServer = request.getfixturevalue(
            prefix + ("http_compact_example" if compact else "http_example")
        )
        async with connect(http.url, forbidden=[signing_key]) as client:
            yield Connected(client, transport, signing_key, LOCAL_PRINCIPAL, layout)


@pytest.fixture(params=FRAMEWORKS)
def as_principal(request: pytest.FixtureRequest, signing_key: str) -> Callable[[str], Any]:
    """`async with as_principal("alice") as client:` connects to the authenticated HTTP server with a token
    (the example on `MCPServer`, then on FastMCP 4 with FastMCP's authentication)."""
    server: HttpExampleServer = request.getfixturevalue(
        "fastmcp_http_auth_example" if request.param == "fastmcp" else "http_auth_example"
    )

    def open_as(name: str) -> Any:
        return connect(server.url, token=token_of(name), forbidden=[signing_key, *TOKENS])

    return open_as


@pytest.fixture(scope="session")
def peer_python() -> str:
    """The interpreter of bench/.peer-venv (FastMCP 4 + fastmcp-tasks), created once when missing; under CI a
    venv that cannot be prepared fails the test instead of skipping it."""
    from bench.peer import PEER_PYTHON, ensure_peer_venv

    problem = ensure_peer_venv(timeout=300)
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the FastMCP peer: {problem}")
        pytest.skip(f"the FastMCP peer: {problem}")
    return str(PEER_PYTHON)
