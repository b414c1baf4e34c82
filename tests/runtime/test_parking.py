"""Parked jobs hold nothing: a job waiting for an answer has no lease and no slot, and resumes by replay.

Issue 12 items 2 and 3: the answer may arrive on any node, after the node that asked is gone.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from pydantic import BaseModel

from handles import Handles, JobContext
from handles.states import Status
from tests.durability.harness import config

from .support import start_as, stored, stored_steps


class Approval(BaseModel):
    approve: bool


def _declare(jobs: Handles, effects: list[str], bodies: list[int]) -> None:
    @jobs.job(asks_input=True)
    async def deploy(ctx: JobContext, version: str) -> str:
        bodies.append(ctx.attempt)
        built = await ctx.step("build", lambda: effects.append(f"build {version}") or f"built {version}")
        await ctx.progress(1, 2, "built")
        approval = await ctx.ask(f"Deploy {built}?", Approval)
        if not approval.approve:
            return "not approved"
        await ctx.step("release", lambda: effects.append(f"release {version}") or "released")
        return "deployed"


async def _wait_for(jobs: Handles, handle: str, status: Status, seconds: float = 10) -> None:
    for _ in range(int(seconds / 0.02)):
        if stored(jobs, handle).status == status.value:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"job is {stored(jobs, handle).status}, not {status.value}")


def test_a_parked_job_holds_no_lease_and_no_slot_and_resumes_by_replay(tmp_path: Path) -> None:
    async def main() -> None:
        effects: list[str] = []
        bodies: list[int] = []
        jobs = Handles(config(tmp_path))
        _declare(jobs, effects, bodies)
        handle = await start_as(jobs, "alice", "deploy", version="1.2")
        await _wait_for(jobs, handle, Status.INPUT_REQUIRED)
        # The run ends once its park (the lease given back) is written and its worker thread hands back to
        # the loop: at once on an idle host, later on a loaded one. A run that kept its slot never ends.
        for _ in range(250):
            if not jobs.runtime.running_ids():
                break
            await asyncio.sleep(0.02)
        parked = stored(jobs, handle)
        assert parked.lease_owner is None and parked.lease_expires_at is None
        assert jobs.runtime.running_ids() == []
        record = await jobs.service.open(jobs.specs["deploy"], "alice", handle)
        await jobs.service.respond(jobs.specs["deploy"], record, {"q1": {"approve": True}})
        await _wait_for(jobs, handle, Status.COMPLETED)
        await jobs.aclose()
        assert effects == ["build 1.2", "release 1.2"]
        assert len(bodies) == 2  # once up to the question, once replayed to the end
        done = stored(jobs, handle)
        assert done.attempts == 1, "resuming after an answer is not a new attempt"
        assert {name: step.status for name, step in stored_steps(jobs, handle).items()} == {
            "build": "completed",
            "release": "completed",
        }

    asyncio.run(main())


def test_a_parked_job_is_answered_and_finished_by_another_node(tmp_path: Path) -> None:
    """The node that asked is gone (stopped); the answer arrives at another one, which finishes the job."""

    async def main() -> None:
        effects: list[str] = []
        bodies: list[int] = []
        first = Handles(config(tmp_path))
        _declare(first, effects, bodies)
        handle = await start_as(first, "alice", "deploy", version="2.0")
        await _wait_for(first, handle, Status.INPUT_REQUIRED)
        await first.aclose()
        assert stored(first, handle).status == Status.INPUT_REQUIRED.value  # a stop does not touch it

        second = Handles(config(tmp_path))
        _declare(second, effects, bodies)
        record = await second.service.open(second.specs["deploy"], "alice", handle)
        await second.service.respond(second.specs["deploy"], record, {"q1": {"approve": True}})
        await _wait_for(second, handle, Status.COMPLETED)
        await second.aclose()
        assert effects == ["build 2.0", "release 2.0"]
        assert stored(second, handle).attempts == 1

    asyncio.run(main())


def test_questions_asked_together_are_all_open_and_the_job_resumes_once_all_are_answered(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        jobs = Handles(config(tmp_path))

        @jobs.job(asks_input=True)
        async def survey(ctx: JobContext) -> list[bool]:
            answers = await asyncio.gather(ctx.ask("First?", Approval), ctx.ask("Second?", Approval))
            return [a.approve for a in answers]

        handle = await start_as(jobs, "alice", "survey")
        await _wait_for(jobs, handle, Status.INPUT_REQUIRED)
        await asyncio.sleep(0.1)
        record = await jobs.service.open(jobs.specs["survey"], "alice", handle)
        assert {q.key for q in await jobs.service.pending_inputs(record)} == {"q1", "q2"}
        await jobs.service.respond(jobs.specs["survey"], record, {"q1": {"approve": True}})
        await asyncio.sleep(0.2)
        assert stored(jobs, handle).status == Status.INPUT_REQUIRED.value
        await jobs.service.respond(jobs.specs["survey"], record, {"q2": {"approve": False}})
        await _wait_for(jobs, handle, Status.COMPLETED)
        await jobs.aclose()
        assert stored(jobs, handle).result["structuredContent"] == {"result": [True, False]}  # type: ignore[index]

    asyncio.run(main())
