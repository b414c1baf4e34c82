"""Claims and leases: queued jobs taken by a worker (`claim_next`, fairly between principals), their
lease kept (`heartbeat`), found run out (`expired_leases`) or given back to the queue (`release`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Text, case, cast, func, update
from sqlalchemy import select as sa_select
from sqlmodel import Session, col, select

from handles.states import ACTIVE, Status
from handles.store.engine import Database
from handles.store.models import _JOBS, CLAIM_ENTRY_HEAD, JobRecord, claim_entry_tail
from handles.store.statements import _HELD_BY_OWNER


class Claims(Database):
    """Claims and leases, a part of `JobRepository` that uses only its `Database`."""

    def has_claimable(self, kinds: Sequence[str]) -> bool:
        """Whether a queued job of `kinds` is due now: one indexed read, no write lock."""
        if not kinds:
            return False
        query = sa_select(col(JobRecord.id)).where(*_claimable(self._lease_now(self.clock()), kinds))
        with self._fast_reading() as connection:
            return connection.execute(query.limit(1)).first() is not None

    def claim_next(
        self,
        owner: str,
        kinds: Sequence[str],
        limit: int,
        lease_seconds: float,
        *,
        held: Mapping[str, int] | None = None,
        share_limit: int | None = None,
        served: Mapping[str, int] | None = None,
    ) -> list[JobRecord]:
        """Claim up to `limit` queued jobs of `kinds` for `owner`, taking turns between principals (ranked by
        what each already runs and its place in its queue, each within `share_limit` of this node's slots)."""
        if not kinds or limit <= 0:
            return []
        now = self.clock()
        with self._writing() as session:
            candidates = self._fair_candidates(session, self._lease_now(now), kinds, limit)
            chosen = _take_turns(candidates, limit, held or {}, share_limit, served or {})
            if not chosen:
                return []
            claimed = session.execute(
                update(JobRecord)
                .where(col(JobRecord.id).in_(chosen), *_claimable(self._lease_now(now)))
                .values(**_claim_values(owner, now, self._lease_now(now), lease_seconds))
                .returning(JobRecord)
                .execution_options(synchronize_session=False)
            )
            records = {record.id: record for record in claimed.scalars().all()}
        return [records[job_id] for job_id in chosen if job_id in records]

    def _fair_candidates(
        self, session: Session, now: Any, kinds: Sequence[str], limit: int
    ) -> list[tuple[str, str, int, int]]:
        """(id, principal key, place in its principal's queue, jobs its principal runs) of claimable jobs."""
        place = (
            func.row_number()
            .over(
                partition_by=JobRecord.principal_key, order_by=(col(JobRecord.run_after), col(JobRecord.id))
            )
            .label("place")
        )
        queue = sa_select(col(JobRecord.id).label("id"), place).where(*_claimable(now, kinds)).subquery()
        first = sa_select(queue.c.id).where(queue.c.place <= limit)
        rows = sa_select(col(JobRecord.id), col(JobRecord.principal_key), col(JobRecord.run_after)).where(
            col(JobRecord.id).in_(first), *_claimable(now)
        )
        rows = rows.with_for_update(skip_locked=True)  # concurrent claimers skip each other's rows
        found = session.execute(rows).all()
        if not found:
            return []
        keys = {row[1] for row in found}
        running: dict[str, int] = dict(
            session.execute(
                sa_select(col(JobRecord.principal_key), func.count())
                .where(
                    col(JobRecord.principal_key).in_(keys),
                    col(JobRecord.status) == Status.WORKING.value,
                    col(JobRecord.lease_owner).is_not(None),
                )
                .group_by(JobRecord.principal_key)
            ).all()
        )
        ordered = sorted(found, key=lambda row: (row[2], row[0]))
        places: dict[str, int] = {}
        ranked: list[tuple[str, str, int, int]] = []
        for job_id, key, _run_after in ordered:
            places[key] = places.get(key, 0) + 1
            ranked.append((job_id, key, places[key], int(running.get(key, 0))))
        return ranked

    def heartbeat(
        self, owner: str, job_ids: Sequence[str], lease_seconds: float
    ) -> tuple[set[str], set[str]]:
        """Extend `owner`'s leases. Returns (ids with a cancel request, ids no longer held)."""
        if not job_ids:
            return set(), set()
        now = self.clock()
        with self._writing() as session:
            held = session.execute(
                update(JobRecord)
                .where(
                    col(JobRecord.id).in_(list(job_ids)),
                    col(JobRecord.lease_owner) == owner,
                    col(JobRecord.status).in_(list(ACTIVE)),
                )
                .values(lease_expires_at=self._lease_now(now) + timedelta(seconds=lease_seconds))
                .returning(col(JobRecord.id), col(JobRecord.cancel_requested_at))
                .execution_options(synchronize_session=False)
            ).all()
        cancelled = {job_id for job_id, requested_at in held if requested_at is not None}
        return cancelled, set(job_ids) - {job_id for job_id, _ in held}

    def expired_leases(self, limit: int) -> list[JobRecord]:
        """Active jobs whose lease ran out: their process is gone."""
        now = self.clock()
        with self._reading() as session:
            rows = session.exec(
                select(JobRecord)
                .where(
                    col(JobRecord.status).in_(list(ACTIVE)),
                    col(JobRecord.lease_owner).is_not(None),
                    col(JobRecord.lease_expires_at) < self._lease_now(now),
                )
                .limit(limit)
            )
            return list(rows)

    def release(
        self,
        job_id: str,
        owner: str,
        *,
        run_after: datetime | None = None,
        message: str | None,
        lease_expired: bool = False,
        resuming: bool = False,
    ) -> bool:
        """Give a job back to the queue, claimable at `run_after` (`resuming`: no new attempt)."""
        now = self.clock()
        expired = [_JOBS.c.lease_expires_at < self._lease_now(now)] if lease_expired else []
        released = (
            update(_JOBS)
            .where(*_HELD_BY_OWNER, *expired)
            .values(
                status=Status.WORKING.value,
                lease_owner=None,
                lease_expires_at=None,
                run_after=self._lease_now(now) if run_after is None else run_after,
                status_message=message,
                resuming=resuming,
                updated_at=now,
                version=_JOBS.c.version + 1,
            )
        )
        with self._writing() as session:
            changed = session.exec(released, params={"job_id": job_id, "owner": owner}).rowcount
        return changed == 1


def _claimable(now: Any, kinds: Sequence[str] = ()) -> tuple[Any, ...]:
    """A job any worker may take at `now` (by the lease clock), of `kinds` when given."""
    due = (
        col(JobRecord.status) == Status.WORKING.value,
        col(JobRecord.lease_owner).is_(None),
        col(JobRecord.cancel_requested_at).is_(None),
        col(JobRecord.run_after) <= now,
    )
    return (*due, col(JobRecord.kind).in_(list(kinds))) if kinds else due


def _take_turns(
    candidates: list[tuple[str, str, int, int]],
    limit: int,
    held: Mapping[str, int],
    share_limit: int | None,
    served: Mapping[str, int],
) -> list[str]:
    """Up to `limit` candidate ids, fairest first; principals at their share go last (work-conserving)."""
    fair = sorted(candidates, key=lambda c: (c[3] + c[2], c[2], served.get(c[1], -1)))
    chosen: list[str] = []
    taken: dict[str, int] = {}
    deferred: list[str] = []
    for job_id, key, _place, _running in fair:
        if len(chosen) >= limit:
            break
        if share_limit is not None and held.get(key, 0) + taken.get(key, 0) >= share_limit:
            deferred.append(job_id)
            continue
        chosen.append(job_id)
        taken[key] = taken.get(key, 0) + 1
    return chosen + deferred[: limit - len(chosen)]


# Built once: these parts of a claim's UPDATE never change.
_CLAIMED_ATTEMPT = JobRecord.attempts + case((col(JobRecord.resuming), 0), else_=1)
_NEXT_VERSION = JobRecord.version + 1
_CLAIM_LOG_HEAD = (
    func.coalesce(col(JobRecord.claim_log), "") + CLAIM_ENTRY_HEAD + cast(_CLAIMED_ATTEMPT, Text)
)


def _claim_values(owner: str, now: datetime, lease_now: Any, lease_seconds: float) -> dict[str, Any]:
    """What a claim writes: the lease, the attempt, the first start time and a claim log entry."""
    return {
        "lease_owner": owner,
        "lease_expires_at": lease_now + timedelta(seconds=lease_seconds),
        "attempts": _CLAIMED_ATTEMPT,
        "claim_log": _CLAIM_LOG_HEAD + claim_entry_tail(now, owner),
        "resuming": False,
        "started_at": func.coalesce(JobRecord.started_at, now),
        "updated_at": now,
        "version": _NEXT_VERSION,
    }
