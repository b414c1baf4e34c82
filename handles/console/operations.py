"""What the console reads and changes, through the same store calls and checks as the MCP faces."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from handles.answer_checks import checked_answers
from handles.job_operations import request_cancel, store_answers
from handles.liveness import LeaseTiming
from handles.principal import principal_match
from handles.runtime import Runtime
from handles.sealing import Sealer
from handles.states import Status
from handles.store import CancelOutcome, InputRequestRecord, JobRecord, StepRecord, Store

PAGE_SIZE = 50
RECENT_FAILURES = timedelta(hours=1)


@dataclass(frozen=True)
class Filters:
    status: str | None = None
    kind: str | None = None
    principal: str | None = None

    @classmethod
    def of(cls, query: dict[str, str]) -> Filters:
        status = query.get("status")
        kind, principal = ((query.get(name) or "").strip() or None for name in ("kind", "principal"))
        return cls(status if status in {s.value for s in Status} else None, kind, principal)

    def query(self) -> dict[str, str]:
        return {name: value for name, value in asdict(self).items() if value}


def cursor_of(job: JobRecord) -> str:
    """The keyset cursor after `job`: its creation time and id."""
    return f"{job.created_at.isoformat()}|{job.id}"


def parse_cursor(text: str | None) -> tuple[datetime, str] | None:
    if not text:
        return None
    created, _, job_id = text.partition("|")
    try:
        when = datetime.fromisoformat(created)
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)), job_id


@dataclass
class Overview:
    """Counts of unfinished jobs per kind and per node, failures of the last hour, the oldest queued job."""

    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    by_node: dict[str, int] = field(default_factory=dict)
    oldest_queued: datetime | None = None


STATES = ("running", "queued", "parked", "failed (1 h)")


@dataclass(eq=False)
class Operations:
    """The console's reads and writes on one store (and, mounted in a server, its runtime)."""

    store: Store
    sealer: Sealer
    timing: LeaseTiming
    runtime: Runtime | None = None

    async def page(self, filters: Filters, after: tuple[datetime, str] | None) -> list[JobRecord]:
        """Up to `PAGE_SIZE` + 1 jobs (the extra one says there is a next page), newest first."""
        return await self.store.read(
            self.store.repo.list_jobs,
            statuses=(filters.status,) if filters.status else (),
            kind=filters.kind,
            principal_matching=None if filters.principal is None else principal_match(filters.principal),
            before=after,
            limit=PAGE_SIZE + 1,
        )

    async def job(self, job_id: str) -> tuple[JobRecord | None, list[InputRequestRecord], list[StepRecord]]:
        repo = self.store.repo
        job = await self.store.read(repo.get, job_id)
        if job is None:
            return None, [], []
        return job, await self.store.read(repo.questions, job_id), await self.store.read(repo.steps, job_id)

    async def overview(self, now: datetime) -> Overview:
        result = Overview(by_kind=defaultdict(lambda: dict.fromkeys(STATES, 0)))
        for kind, status, owner, count, oldest in await self.store.read(self.store.repo.active_counts):
            if status == Status.INPUT_REQUIRED:
                state = "parked"
            elif owner is None:
                state = "queued"
                if result.oldest_queued is None or oldest < result.oldest_queued:
                    result.oldest_queued = oldest
            else:
                state = "running"
                result.by_node[owner] = result.by_node.get(owner, 0) + count
            result.by_kind[kind][state] += count
        failed = await self.store.read(self.store.repo.failed_counts, now - RECENT_FAILURES)
        for kind, count in failed.items():
            result.by_kind[kind]["failed (1 h)"] = count
        return result

    async def answer(self, job: JobRecord, key: str, answer: dict[str, Any], by: str) -> bool:
        """Check and store `answer` to question `key` as `by`; False when it was no longer pending (raises
        `InvalidArguments` when it does not fit the question's schema)."""
        pending = {r.key: r for r in await self.store.read(self.store.repo.pending_inputs, job.id)}
        if key not in pending:
            return False
        sealed = checked_answers(self.sealer, pending, {key: answer}, "send the form again")
        outcome = await store_answers(self.store, self.runtime, job, pending, sealed, by)
        return outcome is not None and key in outcome.accepted

    async def cancel(self, job: JobRecord, by: str) -> CancelOutcome | None:
        """Request the job's cancellation as `by`; the node running it stops it at its next safe point."""
        return await request_cancel(self.store, self.runtime, job, by)
