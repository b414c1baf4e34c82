"""Cancels and interrupts of the jobs running here, never while a durable step executes."""

from __future__ import annotations

import asyncio
import logging

from handles.errors import StoreUnavailable
from handles.outcomes import Outcome, cancelled_at_request, cancelled_with_unknown_steps
from handles.runtime.state import RunLife, RunningJob, RuntimeState
from handles.store import JobRecord

logger = logging.getLogger("handles.runtime")


class RunCancellation(RuntimeState):
    """The part of `Runtime` that interrupts runs: a cancel, a hard step limit, a run lost to another node."""

    def signal_cancel(self, job_id: str) -> bool:
        """Tell a job running here that a cancel was requested; interrupt it after the grace period."""
        entry = self._running.get(job_id)
        if entry is None or entry.ctx.cancelled:
            return entry is not None
        entry.ctx._cancel_requested.set()
        self.store.notifier.notify(job_id)
        loop = asyncio.get_running_loop()
        entry.timers.append(loop.call_later(self.config.cancel_grace_seconds, self._interrupt, entry))
        return True

    def _interrupt(self, entry: RunningJob) -> None:
        """Interrupt a run now, or, while durable steps execute, as soon as they are recorded."""
        if entry.task is None or entry.task.done() or entry.life is RunLife.SETTLING:
            return
        if not entry.ctx.steps_running:
            entry.task.cancel()
            return
        if entry.ctx._interrupt_after_steps():
            limit = self.config.step_cancel_limit_seconds
            loop = asyncio.get_running_loop()
            entry.timers.append(loop.call_later(limit, self._steps_overran, entry))

    def _steps_overran(self, entry: RunningJob) -> None:
        """A cancelled job's steps outlived the hard limit: end it now, with those steps outcome-unknown."""
        steps = sorted(entry.ctx.steps_running)
        if not steps or entry.task is None or entry.task.done() or not entry.ctx.cancelled:
            return
        # The run goes on in its thread; nothing it writes is taken any more.
        if not entry.enter(RunLife.LOST):
            return
        job_id = entry.ctx.job_id
        logger.warning(
            "job %s: step(s) %s still running past the cancel limit; outcome unknown", job_id, steps
        )
        self._spawn(
            self._end_with_unknown_steps(job_id, entry.ctx.principal, steps), f"handles-unknown-{job_id}"
        )

    async def _end_with_unknown_steps(self, job_id: str, principal: str, steps: list[str]) -> None:
        by = await self._cancel_requester(job_id)
        limit = self.config.step_cancel_limit_seconds
        status, values = cancelled_with_unknown_steps(steps, limit, by, principal)
        await self.store.write(
            job_id,
            "changed",
            self.store.repo.end_with_unknown_steps,
            job_id,
            self.owner,
            steps,
            status,
            **values,
        )

    async def _cancelled(self, record: JobRecord) -> Outcome:
        """The outcome of a run interrupted by a cancel: its message says who asked for it."""
        return cancelled_at_request(await self._cancel_requester(record.id), record.principal)

    async def _cancel_requester(self, job_id: str) -> str | None:
        """Who asked to cancel `job_id`, as recorded; None when unreadable now (the message then names nobody)."""
        try:
            job = await self.store.read(self.store.repo.get, job_id)
        except StoreUnavailable:
            return None
        return None if job is None else job.cancel_requested_by

    def _drop(self, job_id: str) -> None:
        """The job ended in the store while it runs here: stop it without writing anything."""
        entry = self._running.get(job_id)
        if entry is None or entry.task is None or entry.life is RunLife.SETTLING:
            return  # a run writing its outcome learns from that write whether it still held the job
        logger.warning("job %s is no longer held here (it ended or was recovered); stopping it", job_id)
        entry.enter(RunLife.LOST)
        if not entry.ctx.steps_running:
            entry.task.cancel()
