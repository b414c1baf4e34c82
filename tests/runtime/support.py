"""Shared pieces of the runtime tests: a stored view of a job, and starting jobs as a given principal.

The runtime tests drive the real `Handles` (store on an SQLite file, or PostgreSQL) and
read what is stored with a second, independent repository.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import pytest

from handles import Handles, JobContext
from handles.handle import HandleCodec
from handles.runtime.sweeper import Sweeper
from handles.states import Status
from handles.store import JobRecord, JobRepository, Started, StepRecord, Store, utc_now
from tests.durability.harness import KEY, config


def job_id_of(handle: str) -> str:
    claims = HandleCodec([KEY]).inspect(handle)
    assert claims is not None, "not a handle signed with the test key"
    return claims.job_id


def stored(jobs: Handles, handle_or_id: str) -> JobRecord:
    """The job as stored, read through a repository of its own (works after `aclose`)."""
    job_id = job_id_of(handle_or_id) if "." in handle_or_id else handle_or_id
    repo = JobRepository(jobs.config.resolved_database_url())
    try:
        record = repo.get(job_id)
    finally:
        repo.dispose()
    assert record is not None, f"job {job_id} is not stored"
    return record


def stored_steps(jobs: Handles, handle_or_id: str) -> dict[str, StepRecord]:
    job_id = job_id_of(handle_or_id) if "." in handle_or_id else handle_or_id
    repo = JobRepository(jobs.config.resolved_database_url())
    try:
        return {step.name: step for step in repo.steps(job_id)}
    finally:
        repo.dispose()


def quick_jobs(
    tmp_path: Path, on_interrupt: Literal["retry", "fail"] = "fail", **settings: Any
) -> tuple[Handles, list[str]]:
    """`Handles` serving one job, `quick`, which returns at once; the list gets the job id of every run's
    first step."""
    jobs = Handles(config(tmp_path, **settings))
    began: list[str] = []

    @jobs.job(on_interrupt=on_interrupt)
    async def quick(ctx: JobContext) -> str:
        began.append(ctx.job_id)
        return "done"

    return jobs, began


def sweeps_done(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """An event set as each sweep pass ends, from the first on: the pass a node makes as it starts writes on
    a worker thread, so a test that needs SQLite's writer free (a start or an outcome written on the event
    loop) waits for it first."""
    done = asyncio.Event()
    sweep_once = Sweeper.sweep_once

    async def sweep_and_say(self: Sweeper) -> dict[str, int]:
        try:
            return await sweep_once(self)
        finally:
            done.set()

    monkeypatch.setattr(Sweeper, "sweep_once", sweep_and_say)
    return done


async def start_as(jobs: Handles, principal: str, kind: str, **arguments: Any) -> str:
    """Start a job for `principal` through the shared service (the tools resolve the principal the same way)."""
    started = await jobs.service.start(jobs.specs[kind], principal, arguments, None)
    return started.handle


async def until_running(jobs: Handles, handle: str, seconds: float = 10.0) -> None:
    """Wait until the job has been claimed by a runtime: it holds a lease, or a run of it has begun
    (a quick job can start and finish between two reads, and then holds no lease any more). Claimed is
    not yet running: a start stores its job claimed before its first step (see `until_begun`)."""
    for _ in range(int(seconds / 0.01)):
        record = stored(jobs, handle)
        if record.lease_owner is not None or record.started_at is not None:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the job never started: {stored(jobs, handle).status_message}")


async def until_begun(began: asyncio.Event, seconds: float = 10.0) -> None:
    """Wait until a job function has set `began` (its first statement): the job runs, not only stored
    claimed. A job a start stores claimed waits a few turns of the loop before its first step (the start's
    reply goes first), and a stop in those turns hands it back to the queue as a job that never ran, so
    a test of what a stop does to a running job waits for this, not for `until_running`."""
    await asyncio.wait_for(began.wait(), seconds)


async def settled(jobs: Handles, handle: str, seconds: float = 5.0) -> JobRecord:
    """The stored job once it no longer works (or as it is after `seconds`)."""
    for _ in range(int(seconds / 0.01)):
        record = stored(jobs, handle)
        if record.status != Status.WORKING.value:
            return record
        await asyncio.sleep(0.01)
    return stored(jobs, handle)


async def start_given_up_while_it_waits(jobs: Handles, key: str, waits_for: str, seconds: float) -> None:
    """Start the job `quick` as alice with idempotency key `key` and cancel the request after `seconds`,
    while its write still waits for `waits_for` (which the caller holds): as when the caller goes away."""
    request = asyncio.create_task(jobs.service.start(jobs.specs["quick"], "alice", {}, key))
    await asyncio.sleep(seconds)
    assert not request.done(), f"the start did not wait for {waits_for}"
    request.cancel()
    await asyncio.gather(request, return_exceptions=True)
    assert request.cancelled()


async def started_again_once_stored(jobs: Handles, key: str, stored_count: Callable[[], int]) -> JobRecord:
    """After `start_given_up_while_it_waits`: once its job is committed (`stored_count()` is 1, or after
    5 s), the same start again finds that job instead of storing one; the job once it has settled."""
    for _ in range(100):
        if stored_count() == 1:
            break
        await asyncio.sleep(0.05)
    retried = await jobs.service.start(jobs.specs["quick"], "alice", {}, key)
    assert not retried.created, "the cancelled start stored no job"
    return await settled(jobs, retried.job.id)


def job_row(job_id: str, **fields: Any) -> JobRecord:
    """A `working` job row of principal alice, due now and kept an hour; `fields` override any column."""
    now = utc_now()
    values: dict[str, Any] = {
        "id": job_id,
        "kind": "k",
        "principal": "alice",
        "status": Status.WORKING.value,
        "arguments": {},
        "arguments_digest": "-",
        "created_at": now,
        "updated_at": now,
        "run_after": now,
        "expires_at": now + timedelta(hours=1),
    }
    values.update(fields)
    return JobRecord(**values)


async def start_in(store: Store, job: JobRecord, *, queued: bool, **options: Any) -> Started:
    """`Store.start` of `job`, awaited when its insert did not run at once."""
    done = store.start(job, queued=queued, **options)
    return done if isinstance(done, tuple) else await done


@contextmanager
def slowed(
    repo: JobRepository,
    method: str,
    seconds: float,
    *,
    after: bool = False,
    when: Callable[..., bool] = lambda *args, **kwargs: True,
) -> Iterator[None]:
    """Fault injection: `repo.<method>` stalls `seconds` before it runs (or `after` it commits), for the
    calls `when` picks; restored on exit."""
    original = getattr(repo, method)

    def stalled(*args: Any, **kwargs: Any) -> Any:
        if not when(*args, **kwargs):
            return original(*args, **kwargs)
        if not after:
            time.sleep(seconds)
        outcome = original(*args, **kwargs)
        if after:
            time.sleep(seconds)
        return outcome

    setattr(repo, method, stalled)
    try:
        yield
    finally:
        setattr(repo, method, original)
