"""A job's lifecycle from its start to its end, its claims and leases, retention and evidence, and the
operator's reads, as short synchronous transactions; each status change is a compare-and-set."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from sqlalchemy import Text, and_, bindparam, case, cast, func, or_, update
from sqlalchemy import insert as sa_insert
from sqlalchemy import select as sa_select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import configure_mappers
from sqlmodel import Session, col, delete, select

from handles.errors import LeaseLost
from handles.states import ACTIVE, TERMINAL, Status, can_transition
from handles.store.audit import evidence
from handles.store.engine import NOTICE, Change, Database, is_sqlite
from handles.store.models import (
    _JOBS,
    CLAIM_ENTRY_HEAD,
    AuditRecord,
    Clock,
    InputRequestRecord,
    JobRecord,
    ResultPartRecord,
    Snapshot,
    StepRecord,
    SwitchRecord,
    _one,
    _rows,
    claim_entry_tail,
    principal_key,
    utc_now,
)
from handles.store.postgres import PostgresOps
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
    _DATABASE_NOW,
    _JOB_BY_ID,
    _OPEN_QUESTIONS_OF_JOB,
    _QUESTION_BY_KEY,
    _QUESTIONS_OF_JOB,
    _STEPS_OF_JOB,
    _pending,
)

if TYPE_CHECKING:
    from handles.principal import PrincipalMatch

__all__ = ["ActiveLimitReached", "AnswerOutcome", "CancelOutcome", "Change", "JobRepository"]

P = ParamSpec("P")
T = TypeVar("T")
_VERSIONS_BATCH = 500  # ids per query when reading the versions of watched jobs
_PARTS = ResultPartRecord.__table__  # type: ignore[attr-defined]
_PART_BY_KEY = sa_select(_PARTS.c.data).where(
    _PARTS.c.job_id == bindparam("job_id"),
    _PARTS.c.file_id == bindparam("file_id"),
    _PARTS.c.part == bindparam("part"),
)
_AUDIT = AuditRecord.__table__  # type: ignore[attr-defined]
ARCHIVE_BATCH = 100  # the most jobs one archiving transaction reads whole, archives and deletes
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


class JobRepository(Database):
    """Synchronous access to the job tables of one database; each engine's hot paths are its `_engine`'s."""

    def __init__(self, url: str, *, clock: Clock = utc_now, lease_clock: str | None = None) -> None:
        """`lease_clock`: "database" judges leases by the database server's clock (PostgreSQL's default),
        "local" by `clock` (the default elsewhere, and with a test clock)."""
        super().__init__(url)
        self.clock = clock
        # Models built from Core rows need their ORM mappers ready.
        configure_mappers()
        self._engine: SqliteOps | PostgresOps = SqliteOps(self) if is_sqlite(url) else PostgresOps(self)
        if lease_clock is None:
            lease_clock = "database" if self._engine.has_clock and clock is utc_now else "local"
        if lease_clock not in ("database", "local"):
            raise ValueError("lease_clock must be 'database' or 'local'")
        if lease_clock == "database" and not self._engine.has_clock:
            raise ValueError(
                "lease_clock='database' needs a database server with a clock of its own (PostgreSQL); "
                "SQLite runs in this process, so its leases are judged by `clock`: use 'local'"
            )
        self._database_leases = lease_clock == "database"
        # Named in every change notice (`load_notice_scope`); None until loaded.
        self.notice_scope: str | None = None

    @property
    def database_leases(self) -> bool:
        """Whether leases are set and judged by the database server's clock."""
        return self._database_leases

    def _lease_now(self, now: datetime) -> Any:
        """`now` for lease arithmetic in SQL: the database's own clock, or the local one."""
        return func.now() if self._database_leases else now

    def read_database_clock(self) -> timedelta:
        """Measure and keep how far the database's clock is ahead of `clock`."""
        if not self._database_leases:
            return timedelta(0)
        with self._read_engine.connect() as connection:  # checked out before the first reading
            before = self.clock()
            database_now = connection.exec_driver_sql("SELECT clock_timestamp()").scalar_one()
            after = self.clock()
        self._clock_offset = database_now - (before + (after - before) / 2)
        return self._clock_offset

    def _lease_now_value(self, session: Session, now: datetime) -> datetime:
        """`now` for lease comparisons made in Python, inside a write transaction."""
        if not self._database_leases:
            return now
        value: datetime = session.execute(sa_select(_DATABASE_NOW)).scalar_one()
        return value

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

    def get_input(self, job_id: str, key: str) -> InputRequestRecord | None:
        with self._engine.hot_reading() as connection:
            return _one(connection, InputRequestRecord, _QUESTION_BY_KEY, job_id, key=key)

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
        return await self._engine.start_on_loop(
            _job_values(job), notice, active_limit, questions, lease_seconds
        )

    def publish(self, job_id: str, origin: str, *, queued: bool = False) -> None:
        """Tell every node listening on PostgreSQL that `job_id` changed, or is queued."""
        self.committed(self.notice(job_id, origin, "queued" if queued else "changed"))

    def notice(self, job_id: str, origin: str, change: Change) -> str:
        """The change notice payload `"<job_id> <origin> <change> <schema>"`."""
        notice = f"{job_id} {origin} {change}"
        return notice if self.notice_scope is None else f"{notice} {self.notice_scope}"

    def load_notice_scope(self) -> str | None:
        """Read the schema of this store's tables into `notice_scope` (None off PostgreSQL)."""
        self.notice_scope = self._engine.load_notice_scope()
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

    def set_status_message(self, job_id: str, message: str | None) -> None:
        now = self.clock()
        with self._writing() as session:
            session.exec(
                update(JobRecord)
                .where(col(JobRecord.id) == job_id, col(JobRecord.status).in_(list(ACTIVE)))
                .values(status_message=message, updated_at=now, version=JobRecord.version + 1)
            )

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
        now = self.clock()
        return self._engine.transition(job_id, target, owner, lease_expired, now, values)

    def _locked(self, session: Session, job_id: str) -> JobRecord | None:
        """The job row, locked for this write transaction (SQLite: BEGIN IMMEDIATE holds the lock)."""
        return session.get(JobRecord, job_id, with_for_update=True)

    def settle_interrupted(
        self, job_id: str, owner: str, *, shutdown: bool, lease_expired: bool = False
    ) -> Status | None:
        """Settle a job whose run stopped before it ended; its new status, or None if not ours."""
        now = self.clock()
        with self._writing() as session:
            job = self._locked(session, job_id)
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
            session.add(job)
            return Status(job.status)

    def park(self, job_id: str, owner: str) -> Status | None:
        """Let go of a job that waits for answers; its status afterwards, or None when not held here."""
        now = self.clock()
        with self._writing() as session:
            job = self._locked(session, job_id)
            if job is None or job.lease_owner != owner or Status(job.status) not in ACTIVE:
                return None
            if job.cancel_requested_at is not None:
                message = _cancelled(job, " while it waited for an answer")
                _transitioned(job, Status.CANCELLED, now, {"status_message": message})
            else:
                released = {"resuming": True, "run_after": self._lease_now_value(session, now)}
                _changed(job, now, dict.fromkeys(_LEASE) | released)  # its lease given back, parked
            session.add(job)
            return Status(job.status)

    def request_cancel(self, job_id: str, by: str | None = None) -> CancelOutcome | None:
        """Record a cancel request: a job no worker holds ends at once, a running one is signalled."""
        now = self.clock()
        with self._writing() as session:
            job = self._locked(session, job_id)
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
            session.add(job)
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
            job = self._locked(session, job_id)
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
            session.add(job)
        return None

    def answer_inputs(
        self, job_id: str, answers: dict[str, dict[str, Any]], by: str | None = None
    ) -> AnswerOutcome | None:
        """Record answers for pending keys; the job works again once none is left pending."""
        now = self.clock()
        with self._writing() as session:
            # Locked: a cancel committing between this read and the write must not be undone.
            job = self._locked(session, job_id)
            if job is None:
                return None
            accepted: list[str] = []
            ignored: list[str] = []
            pending = {r.key: r for r in _pending(session, job_id)}
            if Status(job.status) is not Status.INPUT_REQUIRED:
                return AnswerOutcome(job, [], sorted(answers))
            for key, answer in answers.items():
                record = pending.get(key)
                if record is None:
                    ignored.append(key)
                    continue
                record.answer = answer
                record.answered_at = now
                record.answered_by = by
                session.add(record)
                accepted.append(key)
            if accepted:
                if len(accepted) == len(pending):
                    resumed: dict[str, Any] = {"status_message": "Answer received; continuing."}
                    resumed["run_after"] = self._lease_now_value(session, now)
                    _transitioned(job, Status.WORKING, now, resumed)
                else:
                    _touch(job, now)
                session.add(job)
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
        return self._engine.begin_step(values, repeatable, owner, now, own)

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
        with self._writing() as session:
            job = self._locked(session, job_id)
            if job is None or job.lease_owner != owner or not can_transition(Status(job.status), target):
                return False
            for name in steps:
                step = session.get(StepRecord, (job_id, name))
                if step is not None and step.status == "started":
                    step.status = "unknown"
                    step.finished_at = now
                    session.add(step)
            _transitioned(job, target, now, values)
            session.add(job)
        return True

    def steps(self, job_id: str) -> list[StepRecord]:
        with self._engine.hot_reading() as connection:
            return _rows(connection, StepRecord, _STEPS_OF_JOB, job_id)

    # -- the abandonment deadline ----------------------------------------------

    def touch_abandon_deadline(self, job_id: str) -> None:
        """A caller looked at the job: push its abandonment deadline back."""
        now = self.clock()
        with self._writing() as session:
            job = self._locked(session, job_id)
            if job is None or job.abandon_after_seconds is None or Status(job.status) in TERMINAL:
                return
            job.abandon_at = self._lease_now_value(session, now) + timedelta(
                seconds=job.abandon_after_seconds
            )
            session.add(job)

    # -- result files, too large to return inline, stored in parts ----------------

    def put_result_part(self, job_id: str, file_id: str, part: int, data: bytes) -> None:
        """Store one part of a result file; its first part clears earlier attempts' files."""
        with self._writing() as session:
            if part == 0:
                session.exec(
                    delete(ResultPartRecord).where(
                        col(ResultPartRecord.job_id) == job_id, col(ResultPartRecord.file_id) != file_id
                    )
                )
            session.execute(sa_insert(_PARTS).values(job_id=job_id, file_id=file_id, part=part, data=data))

    def drop_result_file(self, job_id: str, file_id: str) -> None:
        """Delete every part of one result file (a file that could not be finished)."""
        with self._writing() as session:
            session.exec(
                delete(ResultPartRecord).where(
                    col(ResultPartRecord.job_id) == job_id, col(ResultPartRecord.file_id) == file_id
                )
            )

    def result_part(self, job_id: str, file_id: str, part: int) -> bytes | None:
        """One part of a result file, or None when there is no such part."""
        with self._fast_reading() as connection:
            row = connection.execute(
                _PART_BY_KEY, {"job_id": job_id, "file_id": file_id, "part": part}
            ).first()
        return None if row is None else bytes(row[0])

    # -- claims and leases ------------------------------------------------------

    def claim(self, job_id: str, owner: str, lease_seconds: float) -> JobRecord | None:
        """Take a queued job for `owner`; None when it is not queued (someone else has it, or it ended)."""
        now = self.clock()
        with self._writing() as session:
            claimed = session.exec(
                update(JobRecord)
                .where(col(JobRecord.id) == job_id, *_claimable(self._lease_now(now)))
                .values(**_claim_values(owner, now, self._lease_now(now), lease_seconds))
            ).rowcount
            return session.get(JobRecord, job_id) if claimed == 1 else None

    def has_claimable(self, kinds: Sequence[str]) -> bool:
        """Whether a queued job of `kinds` is due now: one indexed read, no write lock."""
        if not kinds:
            return False
        query = sa_select(col(JobRecord.id)).where(*_claimable_of(self._lease_now(self.clock()), kinds))
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
        queue = sa_select(col(JobRecord.id).label("id"), place).where(*_claimable_of(now, kinds)).subquery()
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
            session.exec(
                update(JobRecord)
                .where(
                    col(JobRecord.id).in_(list(job_ids)),
                    col(JobRecord.lease_owner) == owner,
                    col(JobRecord.status).in_(list(ACTIVE)),
                )
                .values(lease_expires_at=self._lease_now(now) + timedelta(seconds=lease_seconds))
            )
            rows = session.exec(
                select(
                    JobRecord.id, JobRecord.lease_owner, JobRecord.cancel_requested_at, JobRecord.status
                ).where(col(JobRecord.id).in_(list(job_ids)))
            ).all()
        held = {r[0] for r in rows if r[1] == owner and r[3] in ACTIVE}
        cancelled = {r[0] for r in rows if r[0] in held and r[2] is not None}
        return cancelled, set(job_ids) - held

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
        conditions = [
            col(JobRecord.id) == job_id,
            col(JobRecord.lease_owner) == owner,
            col(JobRecord.status).in_(list(ACTIVE)),
        ]
        if lease_expired:
            conditions.append(col(JobRecord.lease_expires_at) < self._lease_now(now))
        with self._writing() as session:
            changed = session.exec(
                update(JobRecord)
                .where(and_(*conditions))
                .values(
                    status=Status.WORKING.value,
                    lease_owner=None,
                    lease_expires_at=None,
                    run_after=self._lease_now(now) if run_after is None else run_after,
                    status_message=message,
                    resuming=resuming,
                    updated_at=now,
                    version=JobRecord.version + 1,
                )
            ).rowcount
        return changed == 1

    # -- retention and evidence --------------------------------------------------

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
            if keep_evidence_seconds is not None:
                jobs = list(
                    session.exec(
                        select(JobRecord).where(*expired).limit(limit).with_for_update(skip_locked=True)
                    )
                )
                ids = [job.id for job in jobs]
                if jobs:
                    self._archive(session, jobs, now, now + timedelta(seconds=keep_evidence_seconds))
            else:
                ids = list(
                    session.exec(
                        select(JobRecord.id).where(*expired).limit(limit).with_for_update(skip_locked=True)
                    )
                )
            if not ids:
                return 0
            session.exec(delete(InputRequestRecord).where(col(InputRequestRecord.job_id).in_(ids)))
            session.exec(delete(StepRecord).where(col(StepRecord.job_id).in_(ids)))
            session.exec(delete(ResultPartRecord).where(col(ResultPartRecord.job_id).in_(ids)))
            session.exec(delete(JobRecord).where(col(JobRecord.id).in_(ids)))
        return len(ids)

    def _archive(self, session: Session, jobs: list[JobRecord], now: datetime, keep_until: datetime) -> None:
        questions, steps = _questions_and_steps(session, [job.id for job in jobs])
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
        with Session(self.engine) as session:
            return list(session.exec(query.order_by(col(AuditRecord.id)).limit(limit)))

    def live_evidence(
        self, *, after_id: str = "", job_id: str | None = None, limit: int = 500
    ) -> list[dict[str, Any]]:
        """The evidence of jobs still stored, built from their rows, a page at a time (by job id)."""
        query = select(JobRecord).where(col(JobRecord.id) > after_id)
        if job_id is not None:
            query = query.where(col(JobRecord.id) == job_id)
        with Session(self.engine) as session:
            jobs = list(session.exec(query.order_by(col(JobRecord.id)).limit(limit)))
            questions, steps = _questions_and_steps(session, [job.id for job in jobs])
            return [evidence(job, questions[job.id], steps[job.id]) for job in jobs]

    # -- the operator's reads and switches ---------------------------------------

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
        """SQL for `match`: exact forms by key, patterns case-sensitive (GLOB on SQLite)."""
        principal = col(JobRecord.principal)
        clauses = [col(JobRecord.principal_key).in_([principal_key(p) for p in match.exact])]
        for pattern in match.patterns:
            if self.dialect == "sqlite":
                glob = "".join("*" if piece is None else _glob_literal(piece) for piece in pattern)
                clauses.append(principal.op("GLOB")(glob))
            else:
                like = "".join("%" if piece is None else _like_literal(piece) for piece in pattern)
                clauses.append(principal.like(like, escape="!"))
        return or_(*clauses)

    def count_active(self, *, principal: str | None = None) -> int:
        with self._reading() as session:
            query = select(func.count()).select_from(JobRecord).where(col(JobRecord.status).in_(list(ACTIVE)))
            if principal is not None:
                query = query.where(JobRecord.principal_key == principal_key(principal))
            return int(session.exec(query).one())

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


def _claimable(now: Any) -> tuple[Any, ...]:
    """A job any worker may take at `now` (lease clock): working, not leased, not being cancelled, due."""
    return (
        col(JobRecord.status) == Status.WORKING.value,
        col(JobRecord.lease_owner).is_(None),
        col(JobRecord.cancel_requested_at).is_(None),
        col(JobRecord.run_after) <= now,
    )


def _claimable_of(now: Any, kinds: Sequence[str]) -> tuple[Any, ...]:
    """`_claimable` restricted to `kinds`."""
    return (*_claimable(now), col(JobRecord.kind).in_(list(kinds)))


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


def _glob_literal(text: str) -> str:
    """`text` matched literally by SQLite's GLOB: its wildcards and brackets as one-character sets."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


def _like_literal(text: str) -> str:
    """`text` matched literally by LIKE ... ESCAPE '!'."""
    return "".join(f"!{c}" if c in "%_!" else c for c in text)
