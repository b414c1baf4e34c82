"""Progress is coalesced; argument, result and message sizes are bounded."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import text

from handles import Handles, JobContext
from handles.limits import MAX_ARGUMENTS_BYTES, MAX_STATUS_MESSAGE
from handles.results import PART_BYTES
from handles.runtime.job_writes import JobWrites

from .harness import config, rig


def test_thousands_of_progress_calls_become_a_few_writes_and_the_latest_value_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored: list[float | None] = []  # the progress writes the store was given
    write = JobWrites.progress

    async def counted(self: JobWrites, done: float | None, total: float | None, message: str | None) -> None:
        stored.append(done)
        await write(self, done, total, message)

    monkeypatch.setattr(JobWrites, "progress", counted)

    async def main() -> None:
        jobs = Handles(config(tmp_path, progress_flush_seconds=0.05))
        writes: list[int] = []

        @jobs.job
        async def chatty(ctx: JobContext, n: int) -> int:
            for i in range(n):
                await ctx.progress(i + 1, n, f"step {i + 1}")
                if i % 1000 == 0:
                    await asyncio.sleep(0.01)  # a little real work now and then
            writes.append(len(stored))
            return n

        async with rig(jobs) as r:
            handle = (await r.ok("chatty_start", n=20_000))["handle"]
            await r.ok("chatty_fetch", handle=handle, wait_seconds=20)
            final = await r.ok("chatty_progress", handle=handle)
            assert final["progress"] == {"done": 20000.0, "total": 20000.0, "fraction": 1.0}
            assert final["status_message"] == "Completed."
        assert 1 <= writes[0] < 100, f"{writes[0]} writes for 20000 progress calls"

    asyncio.run(main())


def test_sizes_are_bounded_with_clear_errors_and_nothing_half_stored(tmp_path: Path) -> None:
    async def main() -> None:
        jobs = Handles(config(tmp_path, max_result_file_bytes=2 * PART_BYTES + 10))
        release = asyncio.Event()

        @jobs.job
        async def echo(ctx: JobContext, text: str, result_bytes: int = 0, message: str = "") -> str:
            if message:
                await ctx.progress(1, 2, message)
                await release.wait()
            return "x" * result_bytes if result_bytes else text

        async with rig(jobs) as r:
            body, is_error = await r.call("echo_start", text="y" * (MAX_ARGUMENTS_BYTES + 10))
            assert (
                is_error
                and body["error"] == "invalid_arguments"
                and body["limit_bytes"] == MAX_ARGUMENTS_BYTES
            )

            big = (await r.ok("echo_start", text="", result_bytes=3 * PART_BYTES))["handle"]
            failed, is_error = await r.call("echo_fetch", handle=big, wait_seconds=10)
            assert is_error and failed["status"] == "failed"
            assert failed["error"]["data"]["reason"] == "result_too_large"
            assert failed.get("result") is None and failed.get("result_link") is None
            with jobs.service.store.repo.engine.connect() as connection:  # the parts written are gone
                assert connection.execute(text("SELECT count(*) FROM handles_result_parts")).scalar() == 0

            noisy = "\x1b[31mred\x07 " + "\u202eevil " + "z" * (MAX_STATUS_MESSAGE * 2)
            handle = (await r.ok("echo_start", text="ok", message=noisy))["handle"]
            for _ in range(50):
                seen = await r.ok("echo_progress", handle=handle, wait_seconds=1)
                if seen["progress"]["done"] == 1:
                    break
            shown = seen["status_message"]
            assert len(shown) <= MAX_STATUS_MESSAGE
            assert "\x1b" not in shown and "\x07" not in shown and "\u202e" not in shown
            assert shown.startswith("[31mred") and shown.endswith("\u2026")
            release.set()
            assert (await r.ok("echo_fetch", handle=handle, wait_seconds=10))["result"] == {"result": "ok"}

    asyncio.run(main())
