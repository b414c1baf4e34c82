"""Two nodes sweeping at once archive and delete each expired job once: one evidence record per job."""

from __future__ import annotations

import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from handles.states import Status
from handles.store import JobRepository
from handles.store.models import utc_now
from tests.harness.postgres import repository
from tests.runtime.support import job_row

JOBS = 30


def _stalled_after_reading(repo: JobRepository, seconds: float) -> None:
    """`repo`'s archiving waits `seconds` once it has read the jobs it archives, inside its transaction: the
    other sweep reads meanwhile."""
    archive: Callable[..., Any] = repo._archive

    def stalled(*args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return archive(*args, **kwargs)

    repo._archive = stalled  # type: ignore[method-assign]


def test_two_sweeps_at_once_archive_each_expired_job_once(database_url: str) -> None:
    with repository(database_url) as first, repository(database_url) as second:
        now = utc_now()
        ids = []
        for _ in range(JOBS):
            job, _ = first.insert(
                job_row(
                    f"old-{secrets.token_hex(6)}",
                    status=Status.COMPLETED.value,
                    finished_at=now - timedelta(hours=2),
                    expires_at=now - timedelta(hours=1),
                )
            )
            ids.append(job.id)
        for repo in (first, second):
            _stalled_after_reading(repo, 0.5)
        barrier = threading.Barrier(2)
        deleted: list[int] = []

        def sweep(repo: JobRepository) -> None:
            barrier.wait(timeout=10)
            deleted.append(repo.delete_expired(500, keep_evidence_seconds=3600))

        threads = [threading.Thread(target=sweep, args=(repo,)) for repo in (first, second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        archived = Counter(record.job_id for record in first.archived_evidence(limit=10 * JOBS))
        assert {job_id: archived[job_id] for job_id in ids} == dict.fromkeys(ids, 1)
        assert sum(deleted) == JOBS
        assert all(first.get(job_id) is None for job_id in ids)
