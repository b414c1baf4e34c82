"""The operator's reads and switches: jobs listed by filter, counted by kind and status, and the switches
set and read."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, bindparam, func, or_
from sqlalchemy import select as sa_select
from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select

from handles.states import ACTIVE, Status
from handles.store.engine import Database
from handles.store.models import _JOBS, JobRecord, SwitchRecord, principal_key

if TYPE_CHECKING:
    from handles.principal import PrincipalMatch
    from handles.store.postgres import PostgresOps
    from handles.store.sqlite import SqliteOps

_WAITING_COUNTS = (
    sa_select(_JOBS.c.kind, _JOBS.c.status, func.count())
    .where(
        or_(
            and_(_JOBS.c.status == Status.WORKING.value, _JOBS.c.lease_owner.is_(None)),
            _JOBS.c.status == Status.INPUT_REQUIRED.value,
        )
    )
    .group_by(_JOBS.c.kind, _JOBS.c.status)
)
_ACTIVE_COUNTS = (
    sa_select(_JOBS.c.kind, _JOBS.c.status, _JOBS.c.lease_owner, func.count(), func.min(_JOBS.c.created_at))
    .where(_JOBS.c.status.in_([s.value for s in ACTIVE]))
    .group_by(_JOBS.c.kind, _JOBS.c.status, _JOBS.c.lease_owner)
)
_FAILED_COUNTS = (
    sa_select(_JOBS.c.kind, func.count())
    .where(_JOBS.c.status == Status.FAILED.value, _JOBS.c.finished_at >= bindparam("since"))
    .group_by(_JOBS.c.kind)
)
_ALL_SWITCHES = sa_select(SwitchRecord.__table__)  # type: ignore[attr-defined]


class OperatorReads(Database):
    """The operator's reads and switches, a part of `JobRepository` that uses only its `Database` and ops."""

    _engine: SqliteOps | PostgresOps  # `JobRepository`'s

    def list_jobs(
        self,
        *,
        statuses: Sequence[str] = (),
        kind: str | None = None,
        principal: str | None = None,
        principal_matching: PrincipalMatch | None = None,
        created_before: datetime | None = None,
        created_after: datetime | None = None,
        before: tuple[datetime, str] | None = None,
        limit: int = 50,
    ) -> list[JobRecord]:
        """Jobs matching every given filter, newest first; `before` is a keyset cursor."""
        query = select(JobRecord)
        if statuses:
            query = query.where(col(JobRecord.status).in_(list(statuses)))
        if kind is not None:
            query = query.where(JobRecord.kind == kind)
        if principal is not None:
            query = query.where(JobRecord.principal_key == principal_key(principal))
        if principal_matching is not None:
            query = query.where(self._principal_matches(principal_matching))
        if created_before is not None:
            query = query.where(col(JobRecord.created_at) < created_before)
        if created_after is not None:
            query = query.where(col(JobRecord.created_at) >= created_after)
        if before is not None:
            created, job_id = before
            query = query.where(
                or_(
                    col(JobRecord.created_at) < created,
                    and_(col(JobRecord.created_at) == created, col(JobRecord.id) < job_id),
                )
            )
        newest_first = (col(JobRecord.created_at).desc(), col(JobRecord.id).desc())
        with self._reading() as session:
            return list(session.exec(query.order_by(*newest_first).limit(limit)))

    def _principal_matches(self, match: PrincipalMatch) -> Any:
        """SQL for `match`: exact forms by key, patterns case-sensitive (each engine's `matches`)."""
        principal = col(JobRecord.principal)
        clauses = [col(JobRecord.principal_key).in_([principal_key(p) for p in match.exact])]
        clauses += [self._engine.matches(principal, pattern) for pattern in match.patterns]
        return or_(*clauses)

    def waiting_counts(self) -> dict[tuple[str, str], int]:
        """How many jobs of each kind wait: `(kind, "queued")` for a worker, `(kind, "parked")` for an answer."""
        with self._fast_reading() as connection:
            rows = connection.execute(_WAITING_COUNTS).all()
        return {
            (kind, "parked" if status == Status.INPUT_REQUIRED.value else "queued"): n
            for kind, status, n in rows
        }

    def active_counts(self) -> list[tuple[str, str, str | None, int, datetime]]:
        """Unfinished jobs by `(kind, status, lease owner)`, with the oldest one's creation time."""
        with self._fast_reading() as connection:
            rows = connection.execute(_ACTIVE_COUNTS).all()
        return [(kind, status, owner, n, oldest) for kind, status, owner, n, oldest in rows]

    def failed_counts(self, since: datetime) -> dict[str, int]:
        """Jobs of each kind that failed at or after `since`."""
        with self._fast_reading() as connection:
            rows = connection.execute(_FAILED_COUNTS, {"since": since}).all()
        return {kind: n for kind, n in rows}

    def switches(self) -> list[SwitchRecord]:
        """Every switch as last set, engaged or not."""
        with self._fast_reading() as connection:
            return [
                SwitchRecord.model_construct(**row) for row in connection.execute(_ALL_SWITCHES).mappings()
            ]

    def set_switch(
        self,
        name: str,
        *,
        engaged: bool,
        by: str,
        reason: str | None = None,
        retry_after_seconds: float | None = None,
    ) -> tuple[SwitchRecord, SwitchRecord | None]:
        """Engage or release the switch `name`, recording who did it and when: (as now set, as it was)."""
        values = {
            "engaged": engaged,
            "reason": reason,
            "retry_after_seconds": retry_after_seconds,
            "changed_by": by,
        }
        try:
            return self._set_switch(name, values)
        except IntegrityError:
            # Another operator created the same switch at the same moment: this try updates it.
            return self._set_switch(name, values)

    def _set_switch(self, name: str, values: dict[str, Any]) -> tuple[SwitchRecord, SwitchRecord | None]:
        with self._writing() as session:
            row = session.get(SwitchRecord, name, with_for_update=True)
            before = None if row is None else SwitchRecord.model_construct(**row.model_dump())
            if row is None:
                row = SwitchRecord(name=name, **values, changed_at=self.clock())
                session.add(row)
            else:
                for field, value in {**values, "changed_at": self.clock()}.items():
                    setattr(row, field, value)
            session.flush()
            return SwitchRecord.model_construct(**row.model_dump()), before
