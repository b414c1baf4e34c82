"""The sweeper: one bounded pass over the store (recovery, deadlines, deletion), safe on every node at once."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from handles.outcomes import failed
from handles.states import Status
from handles.store import Store
from handles.telemetry import Telemetry

SWEEP_BATCH = 500
_MISSED_DEADLINES = (
    ("ttl", "ttl", "The job ran longer than its retention allows and was stopped; its handle has expired."),
    (
        "input",
        "input_timeout",
        "No answer to the job's question arrived in time, so the job ended without it. "
        "Start a new job and answer within the time limit.",
    ),
)
"""Which overdue jobs `overdue` lists end `failed`: (its key, the reason, the message)."""


@dataclass(kw_only=True, eq=False)
class Sweeper:
    store: Store
    runs_here: Callable[[str], bool]
    drop: Callable[[str], None]
    signal_cancel: Callable[[str], object]
    requeued: Callable[[str], Awaitable[None]]
    evidence_seconds: Callable[[], float]
    telemetry: Telemetry

    async def sweep_once(self) -> dict[str, int]:
        repo = self.store.repo
        counts = {"recovered": 0, "timed_out": 0, "abandoned": 0, "deleted": 0}
        await self.store.call(repo.read_database_clock)  # the starts of this node store deadlines by it
        for record in await self.store.call(repo.expired_leases, SWEEP_BATCH):
            if self.runs_here(record.id) or record.lease_owner is None:
                continue
            status = await self.store.write(
                record.id,
                "changed",
                repo.settle_interrupted,
                record.id,
                record.lease_owner,
                shutdown=False,
                lease_expired=True,
            )
            if status is not None:
                counts["recovered"] += 1
                self.telemetry.recovered(record.kind)
                if status is Status.FAILED:
                    self.telemetry.ended(record.kind, status.value, "interrupted")
            if status is Status.WORKING:
                await self.requeued(record.id)
        overdue = await self.store.call(repo.overdue, SWEEP_BATCH)
        for key, reason, message in _MISSED_DEADLINES:
            for record in overdue[key]:
                status, values = failed(message, reason)
                if await self.store.write(record.id, "changed", repo.transition, record.id, status, **values):
                    self.drop(record.id)
                    counts["timed_out"] += 1
                    self.telemetry.ended(record.kind, status.value, reason)
        for record in overdue["abandoned"]:
            outcome = await self.store.write(
                record.id, "changed", repo.request_cancel, record.id, "handles:abandoned"
            )
            if outcome is not None:
                self.signal_cancel(record.id)
                counts["abandoned"] += 1
        counts["deleted"] = await self.store.call(repo.delete_expired, SWEEP_BATCH, self.evidence_seconds())
        counts["evidence_deleted"] = await self.store.call(repo.delete_old_evidence, SWEEP_BATCH)
        return counts
