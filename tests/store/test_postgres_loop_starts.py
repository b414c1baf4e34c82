"""A start on PostgreSQL is awaited on the event loop, on connections of the loop's own (change 47): no
worker thread, the same row and the same meanings as a start on a worker thread, a dropped connection
survived, a bounded number of connections, any other event loop served on a worker thread as before, and
a start whose caller goes away while its statement runs still stored and run."""

from __future__ import annotations

import asyncio
import secrets
import threading
from pathlib import Path

import psycopg
import pytest

from handles import Handles, JobContext
from handles.states import Status
from handles.store import JobRepository, Store
from handles.store.engine import LOOP_CONNECTIONS
from handles.store.listen import libpq_url
from tests.durability.harness import config
from tests.harness.postgres import backends_that_started, named, repository, terminate_backends
from tests.runtime.support import job_row, start_given_up_while_it_waits, start_in, started_again_once_stored
from tests.support import count_active


def _id() -> str:
    return f"l-{secrets.token_hex(6)}"


def _principal() -> str:
    return f"local:l-{secrets.token_hex(4)}"


def _stored_keys(url: str, key: str) -> int:
    """How many jobs with idempotency key `key` are committed (read on a connection of its own)."""
    with psycopg.connect(libpq_url(url)) as connection:
        row = connection.execute(
            "select count(*) from handles_jobs where idempotency_key = %s", (key,)
        ).fetchone()
        return int(row[0]) if row else 0


def test_a_start_is_awaited_on_the_event_loop_with_every_worker_thread_busy(postgres_url: str) -> None:
    """The store's only worker thread is held by a call that waits: the start does not need it."""
    with repository(postgres_url) as repo:
        store = Store(repo, threads=1)
        release = threading.Event()

        async def main() -> None:
            assert repo.starts_on_loop
            busy = asyncio.ensure_future(store.call(release.wait, 10))
            await asyncio.sleep(0.05)
            try:
                job = job_row(_id(), principal=_principal(), lease_owner="node-a", attempts=1)
                stored, created = await asyncio.wait_for(
                    start_in(store, job, queued=False, active_limit=5, lease_seconds=30), 5
                )
                assert created and stored.id == job.id and stored.lease_expires_at is not None
                assert not busy.done(), "the worker thread was free after all"
            finally:
                release.set()
                await busy

        asyncio.run(main())


def test_a_start_on_the_loop_stores_what_a_start_on_a_worker_thread_stores(postgres_url: str) -> None:
    """The same job row through both paths: every column read back the same, the lease by the database
    clock, the limit counted, the idempotency key's job returned as stored."""
    with repository(postgres_url) as repo:
        store = Store.of(repo)
        principal = _principal()
        threaded = job_row(_id(), principal=principal, arguments={"name": "é", "n": [1, 2.5, None]})
        on_loop = threaded.model_copy(update={"id": _id(), "idempotency_key": "k-1"})

        async def main() -> None:
            assert (await start_in(store, on_loop, queued=True, active_limit=2))[1]
            with pytest.raises(Exception) as caught:
                await start_in(store, job_row(_id(), principal=principal), queued=True, active_limit=1)
            assert type(caught.value).__name__ == "ActiveLimitReached"
            again = job_row(_id(), principal=principal, idempotency_key="k-1")
            returned, created = await start_in(store, again, queued=True, active_limit=1)
            assert not created and returned == repo.get(on_loop.id)

        repo.insert(threaded, active_limit=5)
        asyncio.run(main())
        a, b = repo.get(threaded.id), repo.get(on_loop.id)
        assert a is not None and b is not None
        differ = {"id", "idempotency_key"}
        assert a.model_dump(exclude=differ) == b.model_dump(exclude=differ)


def test_a_start_after_the_server_dropped_the_loops_connections_is_made_on_a_fresh_one(
    postgres_url: str,
) -> None:
    name = f"handles_loop_drop_{secrets.token_hex(4)}"
    principal = _principal()
    with repository(postgres_url, application_name=name) as repo:
        store = Store.of(repo)

        async def main() -> None:
            await asyncio.gather(
                *(start_in(store, job_row(_id(), principal=principal), queued=False) for _ in range(3))
            )
            assert terminate_backends(postgres_url, name) >= 1
            job = job_row(_id(), principal=principal, lease_owner="node-a", attempts=1)
            stored, created = await start_in(store, job, queued=False, active_limit=10, lease_seconds=30)
            assert created and stored.id == job.id and stored.lease_expires_at is not None

        asyncio.run(main())
        assert count_active(repo, principal=principal) == 4


def test_a_burst_of_starts_shares_a_bounded_number_of_connections(postgres_url: str) -> None:
    name = f"handles_loop_burst_{secrets.token_hex(4)}"
    principal = _principal()
    with repository(postgres_url, application_name=name) as repo:
        store = Store.of(repo)

        async def main() -> None:
            jobs = [job_row(_id(), principal=principal) for _ in range(60)]
            done = await asyncio.gather(
                *(start_in(store, job, queued=True, active_limit=100) for job in jobs)
            )
            assert all(created for _, created in done)
            assert 1 <= backends_that_started(postgres_url, name) <= LOOP_CONNECTIONS

        asyncio.run(main())
        assert count_active(repo, principal=principal) == 60


def test_starts_on_another_event_loop_go_to_a_worker_thread(postgres_url: str) -> None:
    """The loop's connections belong to the first loop that starts a job; a second loop running at the same
    time starts its jobs on a worker thread, and once the first loop has closed, the next loop takes them."""
    with repository(postgres_url) as repo:
        store = Store.of(repo)
        principal = _principal()
        first_running, first_may_end = threading.Event(), threading.Event()
        outcomes: list[bool] = []

        async def first() -> None:
            assert repo.starts_on_loop
            outcomes.append((await start_in(store, job_row(_id(), principal=principal), queued=False))[1])
            first_running.set()
            while not first_may_end.is_set():
                await asyncio.sleep(0.01)

        async def second() -> None:
            assert not repo.starts_on_loop
            outcomes.append((await start_in(store, job_row(_id(), principal=principal), queued=False))[1])

        async def third() -> None:
            assert repo.starts_on_loop
            outcomes.append((await start_in(store, job_row(_id(), principal=principal), queued=False))[1])

        thread = threading.Thread(target=asyncio.run, args=(first(),))
        thread.start()
        assert first_running.wait(10)
        asyncio.run(second())
        first_may_end.set()
        thread.join(10)
        asyncio.run(third())
        assert outcomes == [True, True, True]
        assert count_active(repo, principal=principal) == 3


def test_a_start_whose_caller_goes_away_while_its_statement_waits_is_stored_and_runs(
    tmp_path: Path, postgres_url: str
) -> None:
    """The start's statement waits for a lock another session holds on the jobs table; the caller's request
    is cancelled meanwhile. Once the lock is gone the start commits, and its job runs."""

    async def main() -> None:
        jobs = Handles(config(tmp_path, database_url=postgres_url))

        @jobs.job
        async def quick(ctx: JobContext) -> int:
            return 7

        await jobs.start()
        try:
            with psycopg.connect(libpq_url(postgres_url)) as blocker:
                blocker.execute("LOCK TABLE handles_jobs IN EXCLUSIVE MODE")
                await start_given_up_while_it_waits(jobs, "key-c", "the lock", 0.3)
                blocker.rollback()
            # the shielded start commits once the lock is gone
            record = await started_again_once_stored(
                jobs, "key-c", lambda: _stored_keys(postgres_url, "key-c")
            )
        finally:
            await jobs.aclose()
        assert record.status == Status.COMPLETED.value, record.status_message

    asyncio.run(main())


def test_a_repository_closed_while_idle_leaves_no_connection_open(postgres_url: str) -> None:
    name = f"handles_loop_close_{secrets.token_hex(4)}"
    repo = JobRepository(named(postgres_url, name))
    repo.prepare(auto_migrate=True)
    store = Store.of(repo)
    asyncio.run(start_in(store, job_row(_id(), principal=_principal()), queued=False))
    assert backends_that_started(postgres_url, name) == 1
    repo.dispose()
    assert not repo.starts_on_loop
    for _ in range(50):
        if backends_that_started(postgres_url, name) == 0:
            break
        asyncio.run(asyncio.sleep(0.05))
    assert backends_that_started(postgres_url, name) == 0


def test_starts_on_windows_proactor_loop_go_to_a_worker_thread(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """psycopg cannot wait for a socket on Windows' default `ProactorEventLoop` (there is none on this
    machine): a selector loop of a class named as the proactor loop stands in for it. Its starts run on a
    worker thread, and are stored."""

    class StandIn(asyncio.SelectorEventLoop):
        pass

    monkeypatch.setattr(asyncio, "ProactorEventLoop", StandIn, raising=False)
    with repository(postgres_url) as repo:
        store = Store.of(repo)

        async def main() -> bool:
            assert not repo.starts_on_loop
            return (await start_in(store, job_row(_id(), principal=_principal()), queued=False))[1]

        loop = StandIn()
        try:
            assert loop.run_until_complete(main())
        finally:
            loop.close()
