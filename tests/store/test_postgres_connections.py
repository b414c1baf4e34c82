"""How the store talks to PostgreSQL: change notices go out once the write has committed, and a read
survives a connection the server dropped (issue 14: fewer round trips, no guarantee loosened)."""

from __future__ import annotations

import asyncio
import secrets
import socket
import time
from datetime import timedelta

import psycopg
import pytest
from sqlalchemy.exc import OperationalError

from handles.store import JobRepository, Store, utc_now
from handles.store.engine import CONNECT_TIMEOUT_SECONDS, NOTIFY_CHANNEL
from handles.store.listen import libpq_url
from handles.store.repository import ActiveLimitReached
from tests.harness.postgres import repository, terminate_backends
from tests.runtime.support import job_row


def _notices(listener: psycopg.Connection, job_id: str, seconds: float = 0.5) -> list[str]:
    """The notices about `job_id` (the channel is shared by every schema of the database, so other
    tests' notices arrive too)."""
    payloads = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        payloads += [notice.payload for notice in listener.notifies(timeout=left, stop_after=1)]
    return [payload for payload in payloads if payload.split(" ")[0] == job_id]


def test_a_write_publishes_its_notice_as_it_commits_and_a_rolled_back_one_publishes_none(
    postgres_url: str,
) -> None:
    with (
        repository(postgres_url) as repo,
        psycopg.connect(libpq_url(postgres_url), autocommit=True) as listener,
    ):
        listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        first = job_row(f"n-{secrets.token_hex(4)}")
        repo.publishing(first.id, "node-a", "queued", repo.insert, first, active_limit=1)
        assert _notices(listener, first.id) == [f"{first.id} node-a queued"]

        refused = job_row(f"n-{secrets.token_hex(4)}")  # same principal: over the limit of one active job
        with pytest.raises(ActiveLimitReached):
            repo.publishing(refused.id, "node-a", "queued", repo.insert, refused, active_limit=1)
        assert _notices(listener, refused.id) == [], "a write that rolled back must not be announced"
        assert repo.get(refused.id) is None


def test_a_claimed_start_holds_its_lease_by_the_database_clock_from_the_insert(postgres_url: str) -> None:
    with repository(postgres_url) as repo:
        skewed = utc_now() - timedelta(hours=3)  # this node's clock is three hours behind
        job = job_row(
            f"l-{secrets.token_hex(4)}", lease_owner="node-a", lease_expires_at=skewed, created_at=skewed
        )
        returned, created = repo.insert(job, active_limit=50, lease_seconds=30)
        assert created
        stored = repo.get(job.id)
        assert stored is not None and stored.lease_expires_at is not None
        remaining = (stored.lease_expires_at - utc_now()).total_seconds()
        assert 25 < remaining <= 31, f"lease ends {remaining:.1f} s from the database's now"
        assert returned.lease_expires_at == stored.lease_expires_at, "insert returns the job as stored"


def test_a_read_on_a_connection_the_server_dropped_is_repeated_once_on_a_fresh_one(postgres_url: str) -> None:
    name = f"handles_drop_{secrets.token_hex(4)}"
    job = job_row(f"d-{secrets.token_hex(4)}")

    async def main(repo: JobRepository) -> None:
        store = Store.of(repo)
        assert (await store.read(repo.get, job.id)) is not None  # the pool now holds an idle read connection
        assert terminate_backends(postgres_url, name) >= 1
        record = await store.read(repo.get, job.id)
        assert record is not None and record.id == job.id

    with repository(postgres_url, application_name=name) as repo:
        repo.insert(job)
        asyncio.run(main(repo))


def test_a_database_host_that_never_answers_fails_after_the_connect_timeout_instead_of_hanging() -> None:
    """A host that drops packets would hang libpq forever; the store gives up after its connect timeout,
    so a start-up retries and a request gets the retryable store error (tests/startup)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # the kernel completes the handshake; nothing ever answers the startup packet
    port = silent.getsockname()[1]
    repo = JobRepository(f"postgresql+psycopg://postgres@127.0.0.1:{port}/test")
    began = time.monotonic()
    try:
        with pytest.raises(OperationalError):
            repo.get("any")
        took = time.monotonic() - began
        assert CONNECT_TIMEOUT_SECONDS - 1 <= took < CONNECT_TIMEOUT_SECONDS + 5, (
            f"gave up after {took:.1f} s"
        )
    finally:
        repo.dispose()
        silent.close()
