"""Retention and evidence: overdue jobs found, ended ones deleted past retention (their evidence archived
when it is kept), and the evidence read back, archived or live."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import insert as sa_insert
from sqlmodel import Session, col, delete, select

from handles.states import ACTIVE, TERMINAL, Status
from handles.store.audit import evidence
from handles.store.engine import Database
from handles.store.models import AuditRecord, InputRequestRecord, JobRecord, ResultPartRecord, StepRecord

_AUDIT = AuditRecord.__table__  # type: ignore[attr-defined]
ARCHIVE_BATCH = 100  # the most jobs one archiving transaction reads whole, archives and deletes


class Retention(Database):
    """Retention and evidence, a part of `JobRepository` that uses only its `Database`."""

    def overdue(self, limit: int) -> dict[str, list[JobRecord]]:
        """Active jobs past a deadline by the lease clock: `ttl`, `input` and `abandoned`."""
        now = self._lease_now(self.clock())
        active = col(JobRecord.status).in_(list(ACTIVE))
        past = {
            "ttl": (active, col(JobRecord.expires_at) < now),
            "input": (
                col(JobRecord.status) == Status.INPUT_REQUIRED.value,
                col(JobRecord.input_deadline) < now,
            ),
            "abandoned": (
                active,
                col(JobRecord.cancel_requested_at).is_(None),
                col(JobRecord.abandon_at) < now,
            ),
        }
        with self._reading() as session:
            return {
                key: list(session.exec(select(JobRecord).where(*due).limit(limit)))
                for key, due in past.items()
            }

    def delete_expired(self, limit: int, keep_evidence_seconds: float = 0) -> int:
        """Delete up to `limit` ended jobs past retention, archiving evidence when it is kept."""
        if keep_evidence_seconds <= 0:
            return self._delete_expired_batch(limit, None)
        deleted = 0
        while deleted < limit:
            batch = self._delete_expired_batch(min(limit - deleted, ARCHIVE_BATCH), keep_evidence_seconds)
            deleted += batch
            if batch == 0:
                break
        return deleted

    def _delete_expired_batch(self, limit: int, keep_evidence_seconds: float | None) -> int:
        """One transaction of `delete_expired`, skipping rows another sweeper holds."""
        now = self.clock()
        expired = (
            col(JobRecord.expires_at) < self._lease_now(now),
            col(JobRecord.status).in_(list(TERMINAL)),
        )
        with self._writing() as session:
            locked = select(JobRecord.id).where(*expired).limit(limit).with_for_update(skip_locked=True)
            ids = list(session.exec(locked))
            if not ids:
                return 0
            if keep_evidence_seconds is not None:
                self._archive(session, ids, now, now + timedelta(seconds=keep_evidence_seconds))
            for part in (InputRequestRecord, StepRecord, ResultPartRecord):  # the rows that name the jobs
                session.exec(delete(part).where(col(part.job_id).in_(ids)))
            session.exec(delete(JobRecord).where(col(JobRecord.id).in_(ids)))
        return len(ids)

    def _archive(self, session: Session, ids: list[str], now: datetime, keep_until: datetime) -> None:
        """Archive the evidence of the jobs `ids`, locked by this transaction, before they are deleted."""
        jobs = session.exec(select(JobRecord).where(col(JobRecord.id).in_(ids)))
        questions, steps = _questions_and_steps(session, ids)
        session.execute(
            sa_insert(_AUDIT),
            [
                {
                    "job_id": job.id,
                    "kind": job.kind,
                    "principal": job.principal,
                    "archived_at": now,
                    "keep_until": keep_until,
                    "evidence": evidence(job, questions[job.id], steps[job.id]),
                }
                for job in jobs
            ],
        )

    # -- audit evidence --------------------------------------------------------

    def delete_old_evidence(self, limit: int) -> int:
        """Delete up to `limit` archived evidence records whose own retention has passed."""
        now = self.clock()
        with self._writing() as session:
            ids = list(
                session.exec(select(AuditRecord.id).where(col(AuditRecord.keep_until) < now).limit(limit))
            )
            if ids:
                session.exec(delete(AuditRecord).where(col(AuditRecord.id).in_(ids)))
        return len(ids)

    def archived_evidence(
        self, *, after_id: int = 0, since: datetime | None = None, job_id: str | None = None, limit: int = 500
    ) -> list[AuditRecord]:
        """Archived evidence in archive order, a page at a time (`after_id`: the last id of the page before)."""
        query = select(AuditRecord).where(col(AuditRecord.id) > after_id)
        if since is not None:
            query = query.where(col(AuditRecord.archived_at) >= since)
        if job_id is not None:
            query = query.where(col(AuditRecord.job_id) == job_id)
        with self._reading() as session:
            return list(session.exec(query.order_by(col(AuditRecord.id)).limit(limit)))

    def live_evidence(
        self, *, after_id: str = "", job_id: str | None = None, limit: int = 500
    ) -> list[dict[str, Any]]:
        """The evidence of jobs still stored, built from their rows, a page at a time (by job id)."""
        query = select(JobRecord).where(col(JobRecord.id) > after_id)
        if job_id is not None:
            query = query.where(col(JobRecord.id) == job_id)
        with self._reading() as session:
            jobs = list(session.exec(query.order_by(col(JobRecord.id)).limit(limit)))
            questions, steps = _questions_and_steps(session, [job.id for job in jobs])
            return [evidence(job, questions[job.id], steps[job.id]) for job in jobs]


def _questions_and_steps(
    session: Session, ids: list[str]
) -> tuple[dict[str, list[InputRequestRecord]], dict[str, list[StepRecord]]]:
    """The questions and the steps of the jobs `ids`, by job id, each in the order the evidence lists them."""
    questions: dict[str, list[InputRequestRecord]] = {job_id: [] for job_id in ids}
    for question in session.exec(
        select(InputRequestRecord)
        .where(col(InputRequestRecord.job_id).in_(ids))
        .order_by(col(InputRequestRecord.created_at), col(InputRequestRecord.key))
    ):
        questions[question.job_id].append(question)
    steps: dict[str, list[StepRecord]] = {job_id: [] for job_id in ids}
    for step in session.exec(
        select(StepRecord).where(col(StepRecord.job_id).in_(ids)).order_by(col(StepRecord.started_at))
    ):
        steps[step.job_id].append(step)
    return questions, steps
