"""The sweeper deletes 10,000 expired jobs in bounded batches."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

from handles import Handles, JobContext
from handles.runtime import SWEEP_BATCH
from handles.store import JobRecord
from tests.harness.seed import seed_jobs

from .harness import FakeClock, config


def test_ten_thousand_expired_jobs_are_swept_in_bounded_batches(tmp_path: Path) -> None:
    async def main() -> None:
        clock = FakeClock()
        jobs = Handles(config(tmp_path), clock=clock)

        @jobs.job
        async def noop(ctx: JobContext) -> int:
            return 0

        service = jobs.service
        assert service.schema is not None
        await service.schema.open()  # the tables, made before the first call as a running server makes them
        repo = service.store.repo
        past = clock.now - timedelta(days=2)
        seed_jobs(
            repo.engine.url.render_as_string(hide_password=False),
            10_000,
            kind="noop",
            id_prefix="old-",
            created_at=past,
            expires_at=past + timedelta(days=1),
        )
        live = JobRecord(
            id="live",
            kind="noop",
            principal="local:local",
            status="completed",
            arguments={},
            arguments_digest="-",
            created_at=clock.now,
            updated_at=clock.now,
            run_after=clock.now,
            expires_at=clock.now + timedelta(days=1),
        )
        repo.insert(live)
        passes = 0
        while True:
            counts = await jobs.runtime.sweep_once()
            assert counts["deleted"] <= SWEEP_BATCH
            if counts["deleted"] == 0:
                break
            passes += 1
        assert passes == 10_000 // SWEEP_BATCH
        assert repo.get("old-00000") is None and repo.get("old-09999") is None
        assert repo.get("live") is not None
        await jobs.aclose()

    asyncio.run(main())
