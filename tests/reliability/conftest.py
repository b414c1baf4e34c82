"""Fixtures of the reliability suite: the reliability server behind a cutting, scanning relay.

Every response any test of this directory receives from a reliability server passes through
`WireScanner`; after each test, `_wire_is_clean` fails the test if a signing key, a bearer token,
the database password, a `Traceback` or a server source path was seen on the wire.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Self

import httpx2
import pytest
from hypothesis.configuration import set_hypothesis_home_dir
from mcp_types import CallToolResult

from handles.handle import HandleCodec
from tests.harness.client import mcp_over_http
from tests.harness.process import REPO_ROOT
from tests.harness.relay import Relay, WireScanner
from tests.reliability.app import SECRET_IN_ERRORS, SENSITIVE_OTP, SENSITIVE_PASSPHRASE
from tests.reliability.support import ReliabilityServer, install_audit, report
from tests.support import Reply, ToolClient, token_principal

# hypothesis keeps caches (and would keep an example database) under `.hypothesis/`: not in the repository.
set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "handles-hypothesis"))

CURRENT_KEY = "rel-current-" + secrets.token_urlsafe(40)
PREVIOUS_KEY = "rel-previous-" + secrets.token_urlsafe(40)
"""Still configured (after CURRENT_KEY): its handles verify."""
RETIRED_KEY = "rel-retired-" + secrets.token_urlsafe(40)
"""Never configured on the server: its handles must look made up."""

TOKENS = {f"tok-{name}-{secrets.token_urlsafe(12)}": name for name in ("alice", "bob", "carol")}
PG_PASSWORD = "pg-secret-" + secrets.token_urlsafe(12)
"""Written into the PostgreSQL URL (trust authentication ignores it); it must never reach a client."""

MAX_RESULT_FILE_BYTES = 2_000_000
"""The servers' largest result file: small, so a test can pass it."""

FAST_RUNTIME = {
    "HANDLES_LEASE_SECONDS": "1",
    "HANDLES_HEARTBEAT_SECONDS": "0.2",
    "HANDLES_SWEEP_SECONDS": "0.3",
    "HANDLES_STORE_POLL_SECONDS": "0.2",
    "HANDLES_CANCEL_GRACE_SECONDS": "1",
    "HANDLES_MAX_ACTIVE_PER_PRINCIPAL": "10000",
    "HANDLES_MAX_WAIT_SECONDS": "10",
    "HANDLES_MAX_RESULT_FILE_BYTES": str(MAX_RESULT_FILE_BYTES),
}


def token(name: str) -> str:
    return next(value for value, principal in TOKENS.items() if principal == name)


def principal(name: str) -> str:
    return token_principal(name)


def codec(*keys: str) -> HandleCodec:
    return HandleCodec(list(keys) or [CURRENT_KEY])


# -- the scan --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def scanner() -> Iterator[WireScanner]:
    scan = WireScanner()
    for label, value in (
        ("signing key (current)", CURRENT_KEY),
        ("signing key (previous)", PREVIOUS_KEY),
        ("signing key (retired)", RETIRED_KEY),
        ("database password", PG_PASSWORD),
        ("secret in an exception", SECRET_IN_ERRORS),
        ("sensitive argument", SENSITIVE_PASSPHRASE),
        ("sensitive answer", SENSITIVE_OTP),
        ("stack trace", "Traceback"),
        ("server source path", str(REPO_ROOT / "handles")),
        ("test source path", str(REPO_ROOT / "tests")),
        ("installed package path", "site-packages"),
    ):
        scan.forbid(label, value)
    for value, name in TOKENS.items():
        scan.forbid(f"bearer token of {name}", value)
    yield scan
    report(
        "wire scan",
        {
            "forbidden_strings": len(scan.forbidden),
            "bytes": scan.bytes_scanned,
            "chunks": scan.chunks,
            "hits": len(scan.hits),
        },
    )


@pytest.fixture(autouse=True)
def _wire_is_clean(scanner: WireScanner) -> Iterator[None]:
    before = len(scanner.hits)
    yield
    leaks = scanner.hits[before:]
    assert not leaks, f"forbidden text reached a client: {leaks[:3]}"


# -- deployments -----------------------------------------------------------------------------------


class Deployment:
    """A reliability server, the relay in front of it, its database, and ways to talk to it.

    Not a dataclass: hypothesis prints a failing test's arguments field by field, and the server's
    environment holds the signing keys.
    """

    def __init__(self, server: ReliabilityServer, relay: Relay, database_url: str, effects: Path) -> None:
        self.server, self.relay, self.database_url, self.effects = server, relay, database_url, effects

    def __repr__(self) -> str:
        return f"Deployment({self.url})"

    @property
    def url(self) -> str:
        return self.relay.url

    @asynccontextmanager
    async def client(self, name: str = "alice", **options: Any) -> AsyncIterator[ToolClient]:
        """The official client over the relay with `name`'s token, checking every reply."""
        async with mcp_over_http(
            self.url, token(name), timeout=httpx2.Timeout(30, read=60), **options
        ) as client:
            yield ToolClient(client, forbidden=[CURRENT_KEY, PREVIOUS_KEY, *TOKENS])

    async def call(self, tool: str, arguments: dict[str, Any], name: str = "alice") -> Reply:
        async with self.client(name) as client:
            return await client.call(tool, arguments)

    async def ok(self, tool: str, arguments: dict[str, Any], name: str = "alice") -> dict[str, Any]:
        reply = await self.call(tool, arguments, name)
        assert not reply.is_error, reply.data
        return reply.data

    async def attempt(self, tool: str, arguments: dict[str, Any], name: str = "alice") -> Reply | None:
        """One call on a fresh connection; None when the connection dropped (the client learned nothing)."""
        try:
            return await self.call(tool, arguments, name)
        except (Exception, BaseExceptionGroup):
            return None

    def effects_of(self, job_id: str) -> list[str]:
        if not self.effects.exists():
            return []
        return [line for line in self.effects.read_text().splitlines() if line.startswith(job_id + " ")]

    def close(self) -> None:
        self.relay.close()
        self.server.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def deploy(
    data_dir: Path, scanner: WireScanner, *, database_url: str | None = None, **env: str
) -> Deployment:
    """Start a reliability server on `data_dir` (SQLite there, unless `database_url`), audit triggers installed."""
    data_dir.mkdir(parents=True, exist_ok=True)
    effects = data_dir / "effects.log"
    url = database_url or f"sqlite:///{(data_dir / 'handles.db').as_posix()}"
    install_audit(url)
    server_env = {
        "HANDLES_SECRET_KEYS": f"{CURRENT_KEY},{PREVIOUS_KEY}",
        "RELIABILITY_EFFECTS": str(effects),
        "RELIABILITY_TOKEN_HINT": ",".join(TOKENS),
        **FAST_RUNTIME,
        **env,
    }
    if database_url is not None:
        server_env.setdefault("HANDLES_DATABASE_URL", database_url)
    server = ReliabilityServer(data_dir, server_env, tokens=dict(TOKENS)).start()
    relay = Relay(server.port, scanner).up()
    return Deployment(server, relay, url, effects)


@pytest.fixture(scope="session")
def deployment(tmp_path_factory: pytest.TempPathFactory, scanner: WireScanner) -> Iterator[Deployment]:
    """One reliability server (SQLite) shared by the adversarial, content and fuzz tests."""
    with deploy(tmp_path_factory.mktemp("reliability"), scanner) as deployed:
        yield deployed


def result_text(result: CallToolResult) -> str:
    return json.dumps(result.model_dump(mode="json", by_alias=True))
