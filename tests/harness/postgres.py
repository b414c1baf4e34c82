"""PostgreSQL for one test or one benchmark: a schema of its own, a repository on it, and cutting the
connections of one application (as a server restart or a network fault would).

A URL carries its schema as libpq's `options=-csearch_path=<schema>`, so every connection made from it
(the store's pools, LISTEN, a subprocess server given the URL) works in that schema alone.
"""

from __future__ import annotations

import secrets
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import psycopg
from sqlalchemy import create_engine, text

from handles.store import Clock, JobRepository, utc_now
from handles.store.engine import NOTIFY_CHANNEL
from handles.store.listen import libpq_url
from tests.harness.database import own_connection

CONNECT_TIMEOUT = {"connect_timeout": 3}


def schema_url(base: str, schema: str) -> str:
    """`base` with its connections' search_path set to `schema`."""
    separator = "&" if "?" in base else "?"
    return f"{base}{separator}options={quote(f'-csearch_path={schema}')}"


def schema_of(url: str) -> str:
    """The schema a URL made by `schema_url` sets its connections' search_path to."""
    (options,) = parse_qs(urlsplit(url).query)["options"]
    return options.removeprefix("-csearch_path=")


def unreachable(base: str) -> Exception | None:
    """Why PostgreSQL at `base` cannot be used (the error of `select 1`), or None when it answers."""
    try:
        with own_connection(base, connect_args=CONNECT_TIMEOUT) as connection:
            connection.execute(text("select 1"))
    except Exception as exc:
        return exc
    return None


@contextmanager
def fresh_schema(base: str, prefix: str) -> Iterator[str]:
    """A new empty schema `<prefix>_<random>` for the `with` block, dropped with everything in it
    afterwards; yields `base` pointed at it (`schema_url`)."""
    schema = f"{prefix}_{secrets.token_hex(4)}"
    engine = create_engine(base, connect_args=CONNECT_TIMEOUT)
    with engine.begin() as connection:
        connection.execute(text(f'create schema "{schema}"'))
    try:
        yield schema_url(base, schema)
    finally:
        with engine.begin() as connection:
            connection.execute(text(f'drop schema if exists "{schema}" cascade'))
        engine.dispose()


def named(url: str, application_name: str) -> str:
    """`url` whose connections carry `application_name` (so `terminate_backends` finds them)."""
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}application_name={application_name}"


@contextmanager
def repository(
    url: str, application_name: str | None = None, *, clock: Clock = utc_now
) -> Iterator[JobRepository]:
    """A `JobRepository` on `url` (on `clock`) with the handles tables created; disposed afterwards."""
    repo = JobRepository(url if application_name is None else named(url, application_name), clock=clock)
    repo.prepare(auto_migrate=True)
    try:
        yield repo
    finally:
        repo.dispose()


def terminate_backends(url: str, application_name: str) -> int:
    """Drop, on the server's side, every connection whose application name is `application_name`;
    returns how many there were."""
    return _admin_count(
        url,
        "select count(pg_terminate_backend(pid)) from pg_stat_activity where application_name = :n",
        application_name,
    )


def backends_that_started(url: str, application_name: str) -> int:
    """How many connections named `application_name` have called `handles_start` (their latest statement),
    as the server sees them."""
    return _admin_count(
        url,
        "select count(*) from pg_stat_activity where application_name = :n and query like '%handles_start%'",
        application_name,
    )


def _admin_count(url: str, query: str, application_name: str) -> int:
    """The count `query` (with `:n` for `application_name`) gives, on a connection of its own."""
    with own_connection(url) as connection:
        found: int = connection.execute(text(query), {"n": application_name}).scalar_one()
        return found


@contextmanager
def listening(url: str) -> Iterator[psycopg.Connection]:
    """A connection of its own that LISTENs on the store's change-notice channel, as a node's does."""
    connection = psycopg.connect(libpq_url(url), autocommit=True)
    connection.execute(f"LISTEN {NOTIFY_CHANNEL}")
    try:
        yield connection
    finally:
        connection.close()


def payloads(listener: psycopg.Connection, seconds: float = 0.5) -> list[str]:
    """Every change notice `listener` receives within `seconds`."""
    received: list[str] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        received += [notice.payload for notice in listener.notifies(timeout=left, stop_after=1)]
    return received


def notices(listener: psycopg.Connection, job_id: str, seconds: float = 0.5) -> list[str]:
    """The change notices of `job_id` that `listener` receives within `seconds`."""
    return [payload for payload in payloads(listener, seconds) if payload.split(" ")[0] == job_id]


def round_trips(repo: JobRepository, operation: Callable[[], Any]) -> tuple[int, list[str]]:
    """The round trips `operation` makes on `repo`'s connections (counted from libpq's trace), warm: it runs
    once first (the first use of a connection looks up types), then once counted; and what it sent."""
    from bench.round_trips import Tracer

    tracer = Tracer(Path(tempfile.mkdtemp(prefix="trips-")))
    for engine in {repo.engine, repo._read_engine}:
        tracer.attach(engine)
    repo._read_engine.dispose()  # fresh connections, so that each one is traced from its checkout
    repo.engine.dispose()
    try:
        operation()
        mark = tracer.mark()
        operation()
        return tracer.since(mark)
    finally:
        tracer.close()
