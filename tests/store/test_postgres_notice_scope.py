"""Deployments that share one PostgreSQL database, each in a schema of its own, do not hear each other's change
notices. PostgreSQL delivers a NOTIFY to every listener of the database whatever its schema, so each notice
names the schema of the store that published it, and a node takes only those naming its own: another
deployment's "queued" notice would otherwise wake its dispatcher and queue its next start behind work it cannot
see (it made a test of this suite fail in CI once, when another worker's schema was busy). A notice that names
no schema, as a node of an earlier version sends during a rolling upgrade, is still taken."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import psycopg
import pytest

from handles import Handles
from handles.store.engine import NOTIFY_CHANNEL
from handles.store.listen import libpq_url
from tests.durability.harness import config
from tests.harness.postgres import fresh_schema, schema_of

pytestmark = pytest.mark.timeout(60)


@asynccontextmanager
async def node(url: str, tmp: Path) -> AsyncIterator[Handles]:
    """A started node on `url` (a schema of its own), polling the store only every 30 s: what wakes its
    waiters sooner is a notice it heard."""
    jobs = Handles(config(tmp, database_url=url, store_poll_seconds=30, auto_migrate=True))
    try:
        await jobs.start()
        yield jobs
    finally:
        await jobs.aclose()


async def heard(jobs: Handles, job_id: str, publish: Callable[[], object], seconds: float) -> bool:
    """Whether `jobs` wakes a waiter of `job_id` within `seconds` while `publish()` is sent every 50 ms."""
    event = jobs.service.store.notifier.watch(job_id)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not event.is_set() and loop.time() < deadline:
        await asyncio.to_thread(publish)
        await asyncio.sleep(0.05)
    return event.is_set()


async def test_a_node_takes_only_its_own_schemas_notices(postgres_url: str, tmp_path: Path) -> None:
    with fresh_schema(postgres_url.split("?")[0], "handles_scope_other") as other_url:
        async with (
            node(postgres_url, tmp_path / "b") as b,
            node(postgres_url, tmp_path / "c") as c,
            node(other_url, tmp_path / "a") as a,
        ):
            b_repo, c_repo, a_repo = (n.service.store.repo for n in (b, c, a))
            b_schema = schema_of(postgres_url)
            assert b_repo.notice_scope == c_repo.notice_scope == b_schema
            assert a_repo.notice_scope is not None and a_repo.notice_scope != b_schema
            assert c_repo.notice("j1", "node-c", "queued") == f"j1 node-c queued {b_schema}"

            # Its own deployment's notice wakes it (and shows its listener is up).
            assert await heard(b, "mine", lambda: c_repo.publish("mine", "node-c"), 20)

            # Another deployment's notices, of every kind, wake nothing and tell its dispatcher nothing.
            assert not await heard(b, "theirs", lambda: a_repo.publish("theirs", "node-a", queued=True), 1.0)
            assert not await heard(b, "theirs2", lambda: a_repo.publish("theirs2", "node-a"), 0.5)
            assert b.runtime._backlog is False, "another schema's queued job is not this node's backlog"

            # A notice naming no schema (a node of an earlier version) is taken.
            def unscoped() -> None:
                with psycopg.connect(libpq_url(postgres_url), autocommit=True) as connection:
                    connection.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, "old node-old changed"))

            assert await heard(b, "old", unscoped, 20)
