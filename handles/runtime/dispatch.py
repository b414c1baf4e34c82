"""Taking work: starts run at once in a reserved slot, queued jobs are claimed fairly into free slots."""

from __future__ import annotations

import asyncio
from typing import Any

from handles.jobs import JobContext, JobSpec
from handles.outcomes import Outcome
from handles.runtime.job_runner import JobRunner
from handles.runtime.job_writes import JobWrites
from handles.runtime.leases import every
from handles.runtime.state import RunningJob
from handles.store import Change, JobRecord
from handles.store.models import principal_key


class JobDispatch(JobRunner):
    """The part of `Runtime` that takes jobs into this node's slots and starts their runs."""

    def reserve(self, kind: str, principal: str) -> bool:
        """Hold a slot for a start stored already claimed by this runtime (see `adopt`)."""
        if self.closed or not self._started or kind not in self.specs or self._backlog:
            return False
        return self.slots.reserve_for(principal_key(principal))

    def unreserve(self) -> None:
        self.slots.unreserve(1)

    def queued_message(self, principal: str) -> str:
        """The status message of a start that `reserve` did not run at once: why it waits, truthfully."""
        if self.closed or not self.config.run_workers or not self._started:
            return "Queued; a worker will pick it up shortly."
        if self.slots.free <= 0:
            return "Queued: every worker is busy; it starts as soon as one is free."
        if self.slots.at_share(principal_key(principal)):
            return (
                "Queued: your running jobs hold your share of this server's workers, so other callers' "
                "jobs go first; it starts as soon as none waits or one of yours ends."
            )
        return "Queued; it starts in turn, after the jobs that were waiting before it."

    def adopt(
        self,
        record: JobRecord,
        answers: dict[str, dict[str, Any]],
        *,
        settled: asyncio.Future[Outcome] | None = None,
    ) -> None:
        """Run a job stored already leased here, in the slot `reserve` held; `settled` gets its outcome."""
        if self.closed:
            self.slots.unreserve(1)
            self._spawn(self._hand_back(record.id), name=f"handles-hand-back-{record.id}")
            return
        self.slots.take(record.id, record.principal_key or principal_key(record.principal))
        self._start_task(
            self.specs[record.kind],
            record,
            replay=(answers, {}),
            reply_first=settled is None,
            settled=settled,
        )

    def submit(self, job_id: str) -> None:
        """A job was just stored or became claimable: let the dispatcher take it, fairly, if a slot is free."""
        if not self.config.run_workers or self.closed:
            return
        self._backlog = True
        self._wake.set()

    def _start_task(
        self,
        spec: JobSpec,
        record: JobRecord,
        replay: tuple[dict[str, dict[str, Any]], dict[str, Any]] | None = None,
        *,
        reply_first: bool = False,
        settled: asyncio.Future[Outcome] | None = None,
    ) -> None:
        ctx = JobContext(
            spec=spec,
            job_id=record.id,
            principal=record.principal,
            attempt=record.attempts,
            writes=JobWrites(self.store, record.id, self.owner),
            progress_flush_seconds=self.config.progress_flush_seconds,
            sealer=self.sealer,
        )
        entry = RunningJob(spec=spec, ctx=ctx, replay=replay, reply_first=reply_first, settled=settled)
        self._running[record.id] = entry
        self._leases.leased(record.id)
        entry.task = asyncio.create_task(self._execute(entry, record), name=f"handles-job-{spec.name}")

    async def _dispatch_loop(self) -> None:
        await every(lambda: self._wake, self.config.store_poll_seconds, self._claim_queued, "dispatcher pass")

    async def _claim_queued(self) -> None:
        """One dispatcher pass. Shielded: a drain that stops the dispatcher mid-claim still runs (and then
        drains) what the claim took, instead of leaving it leased to a node that never started it."""
        if self.closed:
            return
        await asyncio.shield(self._spawn(self._claim_into_slots(), name="handles-claim"))

    async def _claim_into_slots(self) -> None:
        if self.slots.free <= 0:
            return
        # Unless work is known to wait, look before reserving: a claim holds every free slot until it returns.
        if not self._backlog and not await self.store.read(self.store.repo.has_claimable, list(self.specs)):
            return
        self._backlog = True  # work waits: a start meanwhile queues behind it, as `reserve` says
        wanted = self.slots.reserve(self.slots.free)
        if wanted <= 0:
            return
        claimed: list[JobRecord] = []
        try:
            claimed = await self.store.call(
                self.store.repo.claim_next,
                self.owner,
                list(self.specs),
                wanted,
                self.config.lease_seconds,
                held=self.slots.held_by_principal(),
                share_limit=self.slots.principal_limit,
                served=self.slots.served(),
            )
        finally:
            self.slots.unreserve(wanted - len(claimed))
        # Fewer than asked for: nothing else waits right now (until a start, a retry or a notice says so).
        self._backlog = len(claimed) >= wanted
        for record in claimed:
            self.slots.take(record.id, record.principal_key or principal_key(record.principal))
            self.store.notifier.notify(record.id)
            self._start_task(self.specs[record.kind], record)

    def _on_remote_change(self, job_id: str, change: Change) -> None:
        """Another node changed `job_id`: wake waiters here, look for a cancel if it runs here, for work if it was queued."""
        self.store.notifier.notify(job_id, change)
        if job_id in self._running:
            self._leases.wake.set()
        elif change == "queued" and not self.closed:
            self._backlog = True
            self._wake.set()
