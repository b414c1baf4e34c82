"""The sweeper deletes 10,000 expired jobs in bounded batches."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

from sqlmodel import Session

from handles import Handles, JobContext
from handles.runtime import SWEEP_BATCH
from handles.store import JobRecord

from .harness import FakeClock, config


def test_ten_thousand_expired_jobs_are_swept_in_bounded_batches(tmp_path: Path) -> None:
    async def main() -> None:
        clock = FakeClock()
        jobs = Handles(config(tmp_path), clock=clock)

        @jobs.job
        async def noop(ctx: JobContext) -> int:
            return 0

        repo = jobs.service.store.repo
        past = clock.now - timedelta(days=2)
        rows = [
            JobRecord(
                id=f"old-{i:05d}",
                kind="noop",
                principal="local:local",
                status="completed",
                arguments={},
                arguments_digest="-",
                created_at=past,
                updated_at=past,
                run_after=past,
                finished_at=past,
                expires_at=past + timedelta(days=1),
            )
            for i in range(10_000)
        ]
        with Session(repo._write_engine) as session:
            session.add_all(rows)
            session.commit()
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
