"""Long-polls: one poll of every watched job per interval for the whole process, not a re-read per waiter
(issue 14), and every waiter still wakes when another process changes its job."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sqlalchemy import event

from handles import Handles, JobContext
from handles.states import Status
from tests.durability.harness import config

from .support import start_as, stored

WAITERS = 200


def test_many_long_polls_cost_one_poll_per_interval_and_all_wake_on_a_change_made_elsewhere(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        # The web node runs no workers and polls every 0.1 s; the jobs are queued for a worker elsewhere.
        web = Handles(config(tmp_path, run_workers=False, store_poll_seconds=0.1))

        @web.job
        async def quick(ctx: JobContext, n: int) -> int:
            return n

        await web.start()
        handles = [await start_as(web, f"p{n % 20}", "quick", n=n) for n in range(WAITERS)]
        records = {h: stored(web, h) for h in handles}

        statements = 0

        def count(*_: object) -> None:
            nonlocal statements
            statements += 1

        repo = web.service.store.repo
        engines = [repo._read_engine, repo.engine]
        if repo._inline_engine is not None:
            engines.append(repo._inline_engine)
        for engine in engines:
            event.listen(engine, "before_cursor_execute", count)

        async def long_poll(handle: str) -> str:
            record = await web.service.wait(records[handle], 30, lambda j: j.status == Status.COMPLETED.value)
            return record.status

        try:
            waiting = [asyncio.create_task(long_poll(h)) for h in handles]
            await asyncio.sleep(0.5)  # every waiter has read its job once and waits
            before = statements
            await asyncio.sleep(1.0)  # ten poll intervals with every waiter parked on its job
            assert not any(task.done() for task in waiting)
            quiet = statements - before
            # One versions query per interval (plus the sweeper's), not one read per waiter per interval.
            assert quiet < 60, f"{quiet} statements in 1 s with {WAITERS} long-polls"

            # Another process (a worker node on the same file) runs the jobs: every waiter wakes.
            worker = Handles(config(tmp_path, max_running=32))

            @worker.job
            async def quick(ctx: JobContext, n: int) -> int:  # the same job, on the worker
                return n

            await worker.start()
            try:
                statuses = await asyncio.wait_for(asyncio.gather(*waiting), timeout=20)
            finally:
                await worker.aclose()
            assert statuses == [Status.COMPLETED.value] * WAITERS
        finally:
            for engine in engines:
                event.remove(engine, "before_cursor_execute", count)
            await web.aclose()

    asyncio.run(main())
