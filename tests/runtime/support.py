"""Shared pieces of the runtime tests: a stored view of a job, and starting jobs as a given principal.

The runtime tests drive the real `Handles` (store on an SQLite file, or PostgreSQL) and
read what is stored with a second, independent repository.
"""

from __future__ import annotations

from typing import Any

from handles import Handles
from handles.handle import HandleCodec
from handles.store import JobRecord, JobRepository, StepRecord
from tests.durability.harness import KEY


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


async def start_as(jobs: Handles, principal: str, kind: str, **arguments: Any) -> str:
    """Start a job for `principal` through the shared service (the tools resolve the principal the same way)."""
    started = await jobs.service.start(jobs.specs[kind], principal, arguments, None)
    return started.handle
