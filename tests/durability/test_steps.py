"""Durable steps: a completed step is never run again by a retry; an interrupted one is reported unknown,
unless it was declared safe to repeat, and then it runs again."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from handles import Handles, JobContext
from tests.runtime.support import job_id_of

from .harness import config, crash, http_node, rig

EFFECTS: list[str] = []


def declare_payment(
    jobs: Handles, *, gate: asyncio.Event, recheck: bool = False, hang_in_step: bool = False
) -> None:
    async def charge(amount: int) -> dict[str, Any]:
        if hang_in_step:
            await asyncio.Event().wait()  # the process "dies" in the middle of the effect
        EFFECTS.append(f"charge {amount}")
        return {"amount": amount, "receipt": f"r-{len(EFFECTS)}"}

    async def look_up_charge() -> dict[str, Any]:
        return {"amount": -1, "receipt": "found-by-recheck"}

    @jobs.job(on_interrupt="retry", max_attempts=3)
    async def pay(ctx: JobContext, amount: int) -> dict[str, Any]:
        receipt = await ctx.step("charge", charge, amount, recheck=look_up_charge if recheck else None)
        await gate.wait()
        return {"receipt": receipt["receipt"], "attempt": ctx.attempt}


async def _start_and_interrupt(tmp: Path, **options: Any) -> str:
    """Start `pay`, wait until the step has begun (or finished), then kill the process mid-job.

    Returns once its lease has run out, for the next node's sweep to retry the job.
    """
    first = Handles(config(tmp))
    async with rig(first, lambda j: declare_payment(j, gate=asyncio.Event(), **options)) as r:
        started = await r.ok("pay_start", amount=42)
        handle = started["handle"]
        wanted = "started" if options.get("hang_in_step") else "completed"
        for _ in range(100):
            state = await r.ok("pay_progress", handle=handle, wait_seconds=1)
            if any(s["name"] == "charge" and s["status"] == wanted for s in state["steps"]):
                break
        else:
            raise AssertionError(f"step never reached {wanted}: {state}")
        await crash(first)
    await asyncio.sleep(first.config.lease_seconds + 0.1)  # the dead process's lease runs out
    return handle


def test_completed_step_is_replayed_not_rerun_after_interruption(tmp_path: Path) -> None:
    EFFECTS.clear()

    async def main() -> None:
        handle = await _start_and_interrupt(tmp_path)
        assert EFFECTS == ["charge 42"]
        gate = asyncio.Event()
        gate.set()
        second = Handles(config(tmp_path))
        async with rig(second, lambda j: declare_payment(j, gate=gate)) as r:
            await second.start()
            result = await r.ok("pay_fetch", handle=handle, wait_seconds=20)
            assert result["status"] == "completed", result
            assert result["result"] == {"receipt": "r-1", "attempt": 2}
            progress = await r.ok("pay_progress", handle=handle)
            assert progress["attempts"] == 2
            assert [(s["name"], s["status"], s["attempt"]) for s in progress["steps"]] == [
                ("charge", "completed", 1)
            ]
        assert EFFECTS == ["charge 42"], "the retry must not charge again"

    asyncio.run(main())


def test_step_without_recorded_outcome_fails_for_reconciliation(tmp_path: Path) -> None:
    EFFECTS.clear()

    async def main() -> None:
        handle = await _start_and_interrupt(tmp_path, hang_in_step=True)
        gate = asyncio.Event()
        gate.set()
        second = Handles(config(tmp_path))
        async with rig(second, lambda j: declare_payment(j, gate=gate)) as r:
            await second.start()
            body, is_error = await r.call("pay_fetch", handle=handle, wait_seconds=20)
            assert is_error and body["status"] == "failed", body
            assert body["error"]["data"]["reason"] == "step_unknown"
            assert body["error"]["data"]["step"] == "charge"
            assert "Reconcile" in body["error"]["message"]
        assert EFFECTS == []

    asyncio.run(main())


def test_recheck_resolves_an_unknown_step(tmp_path: Path) -> None:
    EFFECTS.clear()

    async def main() -> None:
        handle = await _start_and_interrupt(tmp_path, hang_in_step=True, recheck=True)
        gate = asyncio.Event()
        gate.set()
        second = Handles(config(tmp_path))
        async with rig(second, lambda j: declare_payment(j, gate=gate, recheck=True)) as r:
            await second.start()
            result = await r.ok("pay_fetch", handle=handle, wait_seconds=20)
            assert result["result"] == {"receipt": "found-by-recheck", "attempt": 2}
        assert EFFECTS == [], "the recheck, not the effect, ran on the retry"

    asyncio.run(main())


def test_step_names_must_be_unique_within_a_job(tmp_path: Path) -> None:
    async def main() -> None:
        jobs = Handles(config(tmp_path))

        @jobs.job
        async def twice(ctx: JobContext) -> int:
            await ctx.step("same", lambda: 1)
            await ctx.step("same", lambda: 2)
            return 0

        async with rig(jobs) as r:
            started = await r.ok("twice_start")
            body, is_error = await r.call("twice_fetch", handle=started["handle"], wait_seconds=10)
            assert is_error and body["status"] == "failed"
            assert body["error"]["data"]["reason"] == "exception"

    asyncio.run(main())


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_kill_9_mid_step_reruns_a_repeatable_step_and_fails_any_other_for_reconciliation(
    tmp_path: Path, engine: str, request: pytest.FixtureRequest
) -> None:
    """A real process killed (SIGKILL) inside two steps, on an SQLite file and on PostgreSQL: on restart, the
    retry runs the one declared `repeatable` again to completion, and the other, whose effect may have
    happened, fails `step_unknown`."""
    database = {}
    if engine == "postgresql":
        url = request.getfixturevalue("postgres_url")
        database = {"HANDLES_DATABASE_URL": url, "HANDLES_AUTO_MIGRATE": "1"}
    runs = tmp_path / "runs.log"
    node = http_node(
        "tests.durability.steps_app",
        tmp_path,
        STEPS_RUNS_FILE=str(runs),
        STEPS_HOLD_SECONDS="60",
        **database,
    )

    async def call(tool: str, **arguments: Any) -> tuple[dict[str, Any], bool]:
        async with Client(node.url) as client:
            result = await client.call_tool(tool, arguments)
        assert result.structured_content is not None, result
        return result.structured_content, bool(result.is_error)

    def runs_of(handle: str) -> list[str]:
        job = job_id_of(handle)
        return [line.split()[1] for line in runs.read_text().splitlines() if line.split()[0] == job]

    async def main() -> None:
        with node.running():
            handles = {}
            for repeatable in (True, False):
                started, _ = await call("pipeline_start", repeatable=repeatable)
                handles[repeatable] = started["handle"]
            deadline = time.monotonic() + 20
            while not (runs.exists() and all(runs_of(handle) == ["1"] for handle in handles.values())):
                assert time.monotonic() < deadline, "the steps never began"
                await asyncio.sleep(0.05)
            node.kill()  # inside both steps
            node.env["STEPS_HOLD_SECONDS"] = "0"
            node.start()
            rerun, is_error = await call("pipeline_fetch", handle=handles[True], wait_seconds=20)
            assert not is_error and rerun["status"] == "completed", rerun
            assert rerun["result"] == {"step": "worked in attempt 2", "attempt": 2}
            progress, _ = await call("pipeline_progress", handle=handles[True])
            assert [(s["name"], s["status"], s["attempt"]) for s in progress["steps"]] == [
                ("work", "completed", 2)
            ]
            honest, is_error = await call("pipeline_fetch", handle=handles[False], wait_seconds=20)
            assert is_error and honest["status"] == "failed", honest
            assert honest["error"]["data"] == {"reason": "step_unknown", "step": "work"}
            assert "Reconcile" in honest["error"]["message"]
        assert runs_of(handles[True]) == ["1", "2"], "the repeatable step ran again in the retry"
        assert runs_of(handles[False]) == ["1"], "the other step never runs twice"

    asyncio.run(main())
