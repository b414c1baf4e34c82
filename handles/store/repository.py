"""JobRepository, the one API every caller holds: a job's lifecycle from its start to its end as short
synchronous transactions, each status change a compare-and-set; its claims, retention and operator's reads
are its parts'."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import bindparam
from sqlalchemy import insert as sa_insert
from sqlalchemy import select as sa_select
from sqlalchemy.orm import configure_mappers
from sqlmodel import Session, delete

from handles.errors import LeaseLost
from handles.states import ACTIVE, TERMINAL, Status, can_transition
from handles.store.claims import Claims
from handles.store.engine import NOTICE, Change, P, T
from handles.store.models import (
    _JOBS,
    Clock,
    InputRequestRecord,
    JobRecord,
    ResultPartRecord,
    Snapshot,
    StepRecord,
    _one,
    _rows,
    utc_now,
)
from handles.store.operator_reads import OperatorReads
from handles.store.postgres import PostgresOps
from handles.store.retention import Retention
from handles.store.rules import (
    _LEASE,
    ActiveLimitReached,
    _cancelled,
    _changed,
    _interrupted_outcome,
    _job_values,
    _touch,
    _transitioned,
    _waiting_as,
)
from handles.store.sqlite import SqliteOps
from handles.store.statements import (
    _ANSWERS_OF_JOB,
    _JOB_BY_ID,
    _OPEN_QUESTIONS_OF_JOB,
    _QUESTIONS_OF_JOB,
    _STEPS_OF_JOB,
    _pending,
)

__all__ = ["ActiveLimitReached", "AnswerOutcome", "CancelOutcome", "Change", "JobRepository"]

_VERSIONS_BATCH = 500  # ids per query when reading the versions of watched jobs
_PARTS = ResultPartRecord.__table__  # type: ignore[attr-defined]
_PART_BY_KEY = sa_select(_PARTS.c.data).where(
    _PARTS.c.job_id == bindparam("job_id"),
    _PARTS.c.file_id == bindparam("file_id"),
    _PARTS.c.part == bindparam("part"),
)


@dataclass(frozen=True)
class CancelOutcome:
    """What `request_cancel` did: the job as it now stands, and whether it ended right away."""

    job: JobRecord
    ended_now: bool


@dataclass(frozen=True)
class AnswerOutcome:
    """Which answered keys were taken and which ignored (unknown or already answered)."""

    job: JobRecord
    accepted: list[str]
    ignored: list[str]


class JobRepository(Claims, Retention, OperatorReads):
    """Synchronous access to the job tables of one database; each engine's hot paths are its `_engine`'s, its
    claims, retention and operator's reads its parts' (each uses only the `Database` they share)."""

    notice_scope: str | None = None  # named in every change notice (`load_notice_scope`); None until loaded

    def __init__(self, url: str, *, clock: Clock = utc_now, lease_clock: str | None = None) -> None:
        """`lease_clock`: "database" judges leases by the database server's clock (PostgreSQL's default),
        "local" by `clock` (the default elsewhere, and with a test clock)."""
        super().__init__(url, clock=clock, lease_clock=lease_clock)
        configure_mappers()  # models built from Core rows need their ORM mappers ready
        self._engine = SqliteOps(self) if self.sqlite else PostgresOps(self)

    # -- reads -------------------------------------------------------------

    def get(self, job_id: str) -> JobRecord | None:
        with self._engine.hot_reading() as connection:
            return _one(connection, JobRecord, _JOB_BY_ID, job_id)

    def versions(self, job_ids: Sequence[str]) -> dict[str, int]:
        """The current version of each of `job_ids` that is still stored."""
        found: dict[str, int] = {}
        with self._fast_reading() as connection:
            for start in range(0, len(job_ids), _VERSIONS_BATCH):
                batch = list(job_ids[start : start + _VERSIONS_BATCH])
                rows = connection.execute(sa_select(_JOBS.c.id, _JOBS.c.version).where(_JOBS.c.id.in_(batch)))
                found.update({job_id: version for job_id, version in rows})
        return found

    def pending_inputs(self, job_id: str) -> list[InputRequestRecord]:
        with self._engine.hot_reading() as connection:
            return _rows(connection, InputRequestRecord, _OPEN_QUESTIONS_OF_JOB, job_id)

    def questions(self, job_id: str) -> list[InputRequestRecord]:
        """Every question the job asked, answered or not, in the order asked (the operator's view)."""
        with self._engine.hot_reading() as connection:
            return _rows(connection, InputRequestRecord, _QUESTIONS_OF_JOB, job_id)

    def snapshot(self, job_id: str) -> Snapshot:
        """The job's state, its steps' and its open questions, read in one go."""
        return self._engine.snapshot(job_id)

    def replay_state(self, job_id: str) -> tuple[dict[str, dict[str, Any]], dict[str, StepRecord]]:
        """What a run replays: the job's recorded answers by key, and its steps by name, read in one go."""
        with self._engine.hot_reading() as connection:
            answered = _rows(connection, InputRequestRecord, _ANSWERS_OF_JOB, job_id)
            steps = _rows(connection, StepRecord, _STEPS_OF_JOB, job_id)
        answers = {record.key: record.answer for record in answered if record.answer is not None}
        return answers, {step.name: step for step in steps}

    # -- creation ----------------------------------------------------------

    def insert(
        self,
        job: JobRecord,
        *,
        active_limit: int | None = None,
        questions: Sequence[InputRequestRecord] = (),
        lease_seconds: float | None = None,
    ) -> tuple[JobRecord, bool]:
        """Store a new job, or return the one its idempotency key names: (job, created); `ActiveLimitReached`
        when the principal already has `active_limit` active jobs."""
        return self._engine.insert(_job_values(job), active_limit, questions, lease_seconds)

    @property
    def starts_on_loop(self) -> bool:
        """Whether `start_on_loop` may be awaited on this event loop (PostgreSQL)."""
        return self.loop_connections is not None and self.loop_connections.usable()

    async def start_on_loop(
        self,
        job: JobRecord,
        *,
        notice: str | None,
        active_limit: int | None = None,
        questions: Sequence[InputRequestRecord] = (),
        lease_seconds: float | None = None,
    ) -> tuple[JobRecord, bool]:
        """`insert` awaited on the event loop's own PostgreSQL connection, queuing `notice`."""
        ops = cast(PostgresOps, self._engine)  # `starts_on_loop` is True only there
        return await ops.start_on_loop(_job_values(job), notice, active_limit, questions, lease_seconds)

    def publish(self, job_id: str, origin: str, *, queued: bool = False) -> None:
        """Tell every node listening on PostgreSQL that `job_id` changed, or is queued."""
        self.committed(self.notice(job_id, origin, "queued" if queued else "changed"))

    def notice(self, job_id: str, origin: str, change: Change) -> str:
        """The change notice payload `"<job_id> <origin> <change> <schema>"`."""
        notice = f"{job_id} {origin} {change}"
        return notice if self.notice_scope is None else f"{notice} {self.notice_scope}"

    def load_notice_scope(self) -> str | None:
        """Read the schema of this store's tables into `notice_scope` (None where it sends no notices)."""
        if self.publishes:
            with self._read_engine.connect() as connection:
                self.notice_scope = connection.exec_driver_sql("SELECT current_schema()").scalar()
        return self.notice_scope

    def publishing(
        self, job_id: str, origin: str, change: Change, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run the write method `fn`, queuing the notice that `job_id` changed after each write transaction it
        commits (a no-op off PostgreSQL)."""
        token = NOTICE.set(self.notice(job_id, origin, change))
        try:
            return fn(*args, **kwargs)
        finally:
            NOTICE.reset(token)

    # -- progress and status -----------------------------------------------

    def set_progress(
        self, job_id: str, owner: str, done: float | None, total: float | None, message: str | None
    ) -> bool:
        """Store a running job's progress if `owner` still holds it; True when stored."""
        values: dict[str, Any] = {"job_id": job_id, "owner": owner, "done": done, "total": total}
        values |= {"message": message, "now": self.clock()}
        return self._engine.set_progress(values)

    def transition(
        self,
        job_id: str,
        target: Status,
        *,
        owner: str | None = None,
        lease_expired: bool = False,
        **values: Any,
    ) -> bool:
        """Move a job to `target` if the transition table allows it (held by `owner`, its lease run out with
        `lease_expired`); True when this call made the change."""
        return self._engine.transition(job_id, target, owner, lease_expired, values)

    @contextmanager
    def _locked(self, job_id: str) -> Iterator[tuple[Session, JobRecord | None]]:
        """A write transaction and the job row, locked for it (SQLite: BEGIN IMMEDIATE holds the lock); the
        session tracks the row, so what the block changes of it is written as the transaction commits."""
        with self._writing() as session:
            yield session, session.get(JobRecord, job_id, with_for_update=True)

    def settle_interrupted(
        self, job_id: str, owner: str, *, shutdown: bool, lease_expired: bool = False
    ) -> Status | None:
        """Settle a job whose run stopped before it ended; its new status, or None if not ours."""
        now = self.clock()
        with self._locked(job_id) as (session, job):
            if job is None or job.lease_owner != owner or Status(job.status) not in ACTIVE:
                return None
            lease_now = self._lease_now_value(session, now)
            if lease_expired and (job.lease_expires_at is None or job.lease_expires_at >= lease_now):
                return None
            target, values = _interrupted_outcome(job, lease_now, shutdown=shutdown)
            if target not in TERMINAL:  # queued again: its lease goes
                values = dict.fromkeys(_LEASE) | values
            if target is Status(job.status):
                _changed(job, now, values)
            else:  # an end, or a run stopped as it asked a question, queued to run again
                _transitioned(job, target, now, values)
            return Status(job.status)

    def park(self, job_id: str, owner: str) -> Status | None:
        """Let go of a job that waits for answers; its status afterwards, or None when not held here."""
        now = self.clock()
        with self._locked(job_id) as (session, job):
            if job is None or job.lease_owner != owner or Status(job.status) not in ACTIVE:
                return None
            if job.cancel_requested_at is not None:
                message = _cancelled(job, " while it waited for an answer")
                _transitioned(job, Status.CANCELLED, now, {"status_message": message})
            else:
                released = {"resuming": True, "run_after": self._lease_now_value(session, now)}
                _changed(job, now, dict.fromkeys(_LEASE) | released)  # its lease given back, parked
            return Status(job.status)

    def request_cancel(self, job_id: str, by: str | None = None) -> CancelOutcome | None:
        """Record a cancel request: a job no worker holds ends at once, a running one is signalled."""
        now = self.clock()
        with self._locked(job_id) as (_, job):
            if job is None:
                return None
            if Status(job.status) in TERMINAL:
                return CancelOutcome(job, ended_now=False)
            if job.cancel_requested_at is None:
                job.cancel_requested_at = now
                job.cancel_requested_by = by
            ended = job.lease_owner is None
            if ended:
                message = _cancelled(job, _waiting_as(job))
                _transitioned(job, Status.CANCELLED, now, {"status_message": message})
            else:
                _touch(job, now)
        return CancelOutcome(job, ended_now=ended)

    # -- input requests ----------------------------------------------------

    def open_input(
        self, job_id: str, owner: str, key: str, message: str, schema: dict[str, Any]
    ) -> InputRequestRecord | None:
        """Ask a question and park the job; the stored request when already answered (a replay)."""
        now = self.clock()
        with self._writing() as session:
            existing = session.get(InputRequestRecord, (job_id, key))
            if existing is not None and existing.answered_at is not None:
                return existing
            if existing is None:
                session.add(
                    InputRequestRecord(
                        job_id=job_id, key=key, message=message, requested_schema=schema, created_at=now
                    )
                )
            job = session.get(JobRecord, job_id, with_for_update=True)
            if job is None or job.lease_owner != owner or Status(job.status) not in ACTIVE:
                raise LeaseLost(job_id)
            values: dict[str, Any] = {"status_message": message}
            if job.input_deadline is None and job.input_timeout_seconds is not None:
                deadline_now = self._lease_now_value(session, now)
                values["input_deadline"] = deadline_now + timedelta(seconds=job.input_timeout_seconds)
            if Status(job.status) is Status.INPUT_REQUIRED:  # another question of the same run: no move
                _changed(job, now, values)
            else:
                _transitioned(job, Status.INPUT_REQUIRED, now, values)
        return None

    def answer_inputs(
        self, job_id: str, answers: dict[str, dict[str, Any]], by: str | None = None
    ) -> AnswerOutcome | None:
        """Record answers for pending keys; the job works again once none is left pending."""
        now = self.clock()
        # Locked: a cancel committing between this read and the write must not be undone.
        with self._locked(job_id) as (session, job):
            if job is None:
                return None
            if Status(job.status) is not Status.INPUT_REQUIRED:
                return AnswerOutcome(job, [], sorted(answers))
            accepted: list[str] = []
            ignored: list[str] = []
            pending = {r.key: r for r in _pending(session, job_id)}
            for key, answer in answers.items():
                record = pending.get(key)
                if record is None:
                    ignored.append(key)
                    continue
                record.answer = answer
                record.answered_at = now
                record.answered_by = by
                accepted.append(key)
            if accepted:
                if len(accepted) == len(pending):
                    resumed: dict[str, Any] = {"status_message": "Answer received; continuing."}
                    resumed["run_after"] = self._lease_now_value(session, now)
                    _transitioned(job, Status.WORKING, now, resumed)
                else:
                    _touch(job, now)
        return AnswerOutcome(job, accepted, ignored)

    # -- durable steps --------------------------------------------------------

    def begin_step(
        self,
        job_id: str,
        owner: str,
        name: str,
        attempt: int,
        *,
        started_at: datetime | None = None,
        repeatable: bool = False,
    ) -> tuple[StepRecord, bool]:
        """Record that step `name` starts unless already known: (record, fresh); `started_at` lets a retry
        recognise its own committed try. Raises `LeaseLost` when `owner` no longer holds the job."""
        now = self.clock() if started_at is None else started_at
        values: dict[str, Any] = {"job_id": job_id, "name": name, "status": "started", "attempt": attempt}
        values |= {"started_at": now, "finished_at": None, "result": None, "error": None}
        own = None if started_at is None else (attempt, started_at)  # what an earlier try stored
        return self._engine.begin_step(values, repeatable, owner, own)

    def finish_step(
        self,
        job_id: str,
        owner: str,
        name: str,
        *,
        result: Any = None,
        error: str | None = None,
        attempt: int | None = None,
    ) -> None:
        """Record a started step's outcome; raises `LeaseLost` when `owner` no longer holds the job, after
        writing the outcome of its own run's step (`attempt`) if still started."""
        now = self.clock()
        status = "failed" if error is not None else "completed"
        values = {"job_id": job_id, "owner": owner, "name": name, "now": now, "set_status": status}
        values |= {"set_result": result, "set_error": error, "set_finished_at": now, "attempt": attempt}
        self._engine.finish_step(values)

    def end_with_unknown_steps(
        self, job_id: str, owner: str, steps: Sequence[str], target: Status, **values: Any
    ) -> bool:
        """End a job whose `steps` are still executing past every limit: they are marked `unknown`."""
        now = self.clock()
        with self._locked(job_id) as (session, job):
            if job is None or job.lease_owner != owner or not can_transition(Status(job.status), target):
                return False
            for name in steps:
                step = session.get(StepRecord, (job_id, name))
                if step is not None and step.status == "started":
                    step.status = "unknown"
                    step.finished_at = now
            _transitioned(job, target, now, values)
        return True

    def steps(self, job_id: str) -> list[StepRecord]:
        with self._engine.hot_reading() as connection:
            return _rows(connection, StepRecord, _STEPS_OF_JOB, job_id)

    # -- the abandonment deadline ----------------------------------------------

    def touch_abandon_deadline(self, job_id: str) -> None:
        """A caller looked at the job: push its abandonment deadline back."""
        now = self.clock()
        with self._locked(job_id) as (session, job):
            if job is None or job.abandon_after_seconds is None or Status(job.status) in TERMINAL:
                return
            after = timedelta(seconds=job.abandon_after_seconds)
            job.abandon_at = self._lease_now_value(session, now) + after

    # -- result files, too large to return inline, stored in parts ----------------

    def put_result_part(self, job_id: str, file_id: str, part: int, data: bytes) -> None:
        """Store one part of a result file; its first part clears earlier attempts' files."""
        with self._writing() as session:
            if part == 0:
                session.execute(delete(_PARTS).where(_PARTS.c.job_id == job_id, _PARTS.c.file_id != file_id))
            session.execute(sa_insert(_PARTS).values(job_id=job_id, file_id=file_id, part=part, data=data))

    def drop_result_file(self, job_id: str, file_id: str) -> None:
        """Delete every part of one result file (a file that could not be finished)."""
        with self._writing() as session:
            session.execute(delete(_PARTS).where(_PARTS.c.job_id == job_id, _PARTS.c.file_id == file_id))

    def result_part(self, job_id: str, file_id: str, part: int) -> bytes | None:
        """One part of a result file, or None when there is no such part."""
        with self._fast_reading() as connection:
            row = connection.execute(
                _PART_BY_KEY, {"job_id": job_id, "file_id": file_id, "part": part}
            ).first()
        return None if row is None else bytes(row[0])
