"""The repository: a job's lifecycle, every read and write of a job from its start to its end, as short
transactions. `JobRepository` is the one object every caller holds: it adds the store's other parts,
each a class on `Database` in a module of its own (`Housekeeping`: retention and evidence;
`OperatorReads`: listings and counts; `ResultFiles`; `SwitchRows`).

Each status change is a compare-and-set `UPDATE ... WHERE status IN (sources)`
guarded by the transition table, so a cancel racing a completion has exactly one
winner. Work that reads then writes runs in a write transaction that takes the
write lock first (`BEGIN IMMEDIATE` on SQLite, row locks on PostgreSQL).

The methods are synchronous; `Store` (store/__init__.py) runs them on worker
threads so the event loop never waits on the database. The engines, connections
and transactions they run in are `Database`'s (engine.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import func, update
from sqlalchemy import select as sa_select
from sqlalchemy.orm import configure_mappers
from sqlmodel import Session, col

from handles.errors import LeaseLost
from handles.states import ACTIVE, TERMINAL, Status, can_transition
from handles.store.claims import Claims
from handles.store.engine import is_sqlite
from handles.store.engines import Change, EngineOps
from handles.store.housekeeping import Housekeeping
from handles.store.models import (
    Clock,
    InputRequestRecord,
    JobRecord,
    JobState,
    StepRecord,
    StepState,
    utc_now,
)
from handles.store.operator_reads import OperatorReads
from handles.store.postgres import PostgresOps
from handles.store.result_files import ResultFiles
from handles.store.rows import _JOBS, _one, _rows
from handles.store.rules import (
    _LEASE,
    ActiveLimitReached,
    _cancelled,
    _changed,
    _interrupted_outcome,
    _job_values,
    _released,
    _touch,
    _transitioned,
    _waiting_as,
)
from handles.store.sqlite import SqliteOps
from handles.store.sqlite_direct import _Prepared
from handles.store.statements import (
    _ANSWERS_OF_JOB,
    _DATABASE_NOW,
    _JOB_BY_ID,
    _OPEN_QUESTIONS_OF_JOB,
    _QUESTION_BY_KEY,
    _QUESTIONS_OF_JOB,
    _START_DEADLINES,
    _STEPS_OF_JOB,
    _pending,
)
from handles.store.switch_rows import SwitchRows

__all__ = ["ActiveLimitReached", "AnswerOutcome", "CancelOutcome", "Change", "JobRepository"]

P = ParamSpec("P")
T = TypeVar("T")
_VERSIONS_BATCH = 500  # ids per query when reading the versions of watched jobs


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


class JobRepository(Claims, Housekeeping, OperatorReads, ResultFiles, SwitchRows):
    """Synchronous access to the job tables of one database (its engines and transactions: `Database`).

    The job's lifecycle is here; its parts of their own: `Claims` (claims.py), `Housekeeping` (housekeeping.py),
    `OperatorReads` (operator_reads.py), `ResultFiles` (result_files.py) and `SwitchRows`
    (switch_rows.py); what each engine does its own way, `EngineOps` (engines.py)."""

    def __init__(self, url: str, *, clock: Clock = utc_now, lease_clock: str | None = None) -> None:
        """`lease_clock`: "database" judges and sets leases by the database server's clock (the default on
        PostgreSQL, so nodes with skewed clocks agree), "local" by `clock` (the default elsewhere, and
        whenever a test clock is injected)."""
        super().__init__(url)
        self.clock = clock
        self._prepared: dict[Any, _Prepared] = {}  # the hot reads' statements, compiled (`_prepare`)
        # Models built from Core rows (the hot reads) need their ORM mappers ready.
        configure_mappers()
        # What this engine does its own way (sqlite.py, postgres.py): chosen once, here.
        self._engine: EngineOps = SqliteOps(self) if is_sqlite(url) else PostgresOps(self)
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
        # How far the database's clock is ahead of `clock`, as last measured (`read_database_clock`).
        self._clock_offset = timedelta(0)
        # The schema this store's tables live in, named in every change notice it publishes
        # (`load_notice_scope`); None until loaded, and then the notices name none.
        self.notice_scope: str | None = None

    @property
    def publishes(self) -> bool:
        """Whether this store tells other nodes of its changes by notices (PostgreSQL's `pg_notify`)."""
        return self._engine.publishes

    @property
    def database_leases(self) -> bool:
        """Whether leases are set and judged by the database server's clock."""
        return self._database_leases

    def _lease_now(self, now: datetime) -> Any:
        """`now` for lease arithmetic in SQL: the database's own clock, or the local one."""
        return func.now() if self._database_leases else now

    def read_database_clock(self) -> timedelta:
        """Measure how far the database's clock is ahead of this node's (`clock`), when leases are judged by
        the database's (else zero), and keep it: the deadlines a start stores, which its caller sets by this
        node's clock (`run_after`, `expires_at`, `abandon_at`, `input_deadline`), are moved by it, so every
        node judges them by the database's clock, as it judges leases. The sweeper measures it each pass."""
        if not self._database_leases:
            return timedelta(0)
        self._clock_offset = self._engine.clock_offset(self.clock)
        return self._clock_offset

    def _by_database_clock(self, values: Mapping[str, Any]) -> Mapping[str, Any]:
        """A new job's row `values` with its deadlines moved from this node's clock to the database's."""
        offset = self._clock_offset
        if not offset:
            return values
        moved = {name: values[name] + offset for name in _START_DEADLINES if values[name] is not None}
        return {**values, **moved}

    def _lease_now_value(self, session: Session, now: datetime) -> datetime:
        """`now` for lease comparisons made in Python, inside a write transaction."""
        if not self._database_leases:
            return now
        value: datetime = session.execute(sa_select(_DATABASE_NOW)).scalar_one()
        return value

    def _hot_reading(self) -> AbstractContextManager[Any]:
        """What the hot reads by key (`_one`, `_rows`) run on, each statement compiled once and run past
        SQLAlchemy's statement execution where the engine can (`EngineOps.hot_reading`)."""
        return self._engine.hot_reading()

    def _prepare(self, statement: Any) -> _Prepared:
        prepared = self._prepared.get(statement)
        if prepared is None:
            prepared = self._prepared[statement] = _Prepared(statement, self._write_engine.dialect)
        return prepared

    # -- reads -------------------------------------------------------------

    def get(self, job_id: str) -> JobRecord | None:
        with self._hot_reading() as connection:
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
        with self._hot_reading() as connection:
            return _rows(connection, InputRequestRecord, _OPEN_QUESTIONS_OF_JOB, job_id)

    def questions(self, job_id: str) -> list[InputRequestRecord]:
        """Every question the job asked, answered or not, in the order asked (the operator's view)."""
        with self._hot_reading() as connection:
            return _rows(connection, InputRequestRecord, _QUESTIONS_OF_JOB, job_id)

    def snapshot(self, job_id: str) -> tuple[JobState | None, list[InputRequestRecord], list[StepState]]:
        """The job's state and its steps' (only the columns a caller following it is shown), and its open
        questions (when it waits for answers), read in one go: one statement, and on SQLite a second
        only while the job waits for answers."""
        return self._engine.snapshot(job_id)

    def replay_state(self, job_id: str) -> tuple[dict[str, dict[str, Any]], dict[str, StepRecord]]:
        """What a run replays: the job's recorded answers by key, and its steps by name, read in one go."""
        with self._hot_reading() as connection:
            answered = _rows(connection, InputRequestRecord, _ANSWERS_OF_JOB, job_id)
            steps = _rows(connection, StepRecord, _STEPS_OF_JOB, job_id)
        answers = {record.key: record.answer for record in answered if record.answer is not None}
        return answers, {step.name: step for step in steps}

    def get_input(self, job_id: str, key: str) -> InputRequestRecord | None:
        with self._hot_reading() as connection:
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
        """Store a new job, or return the job its idempotency key already names: (job, created).

        With `active_limit`, refuse (`ActiveLimitReached`) when the principal already
        has that many active jobs; the count and the insert share one transaction, as do
        `questions` (asked before the job starts) and the job. A job stored already
        claimed (`lease_owner` set) with `lease_seconds` holds its lease for that long
        by the lease clock (the database's own, on PostgreSQL), set by the insert itself.
        """
        # Core, not the ORM: the row is written from the model's values and the stored job comes
        # back as a detached model, as the hot reads build them (the ORM's unit of work costs more
        # than the insert itself). `job` itself is left as it was given.
        return self._engine.insert(_job_values(job), active_limit, questions, lease_seconds)

    @property
    def starts_on_loop(self) -> bool:
        """Whether a start may be awaited here, on this event loop (`start_on_loop`): PostgreSQL, on the loop
        its connections for starts belong to (`LoopConnections`)."""
        return self._engine.starts_on_loop

    async def start_on_loop(
        self,
        job: JobRecord,
        *,
        notice: str | None,
        active_limit: int | None = None,
        questions: Sequence[InputRequestRecord] = (),
        lease_seconds: float | None = None,
    ) -> tuple[JobRecord, bool]:
        """`insert` on PostgreSQL awaited on the event loop, where `starts_on_loop`: the same call of
        `handles_start` as `insert` makes on a worker thread, sent and answered on one of the loop's own
        connections (`LoopConnections`), with `notice` as the change notice queued once it stored the job
        (None: none).

        As on a worker thread, a call on a connection the server dropped is made once more on a fresh one,
        and errors come out as SQLAlchemy's exceptions (`PostgresOps.start_on_loop`).
        """
        return await self._engine.start_on_loop(
            _job_values(job), notice, active_limit, questions, lease_seconds
        )

    def publish(self, job_id: str, origin: str, *, queued: bool = False) -> None:
        """Tell every node listening on PostgreSQL that `job_id` changed, or is queued for a worker.

        A no-op on other databases. The payload is `notice`'s; it goes out within milliseconds, with the
        others pending (`NoticeSender`), and at the latest when the repository is disposed.
        """
        self._engine.publish(job_id, origin, "queued" if queued else "changed")

    def notice(self, job_id: str, origin: str, change: Change) -> str:
        """The change notice (the payload on `NOTIFY_CHANNEL`) that `job_id` changed by `change`, from
        `origin`: `"<job_id> <origin> <change> <schema>"`, the last the schema of this store's tables
        (`notice_scope`), left out until it is loaded. PostgreSQL delivers a notice to every listener of
        the database, whatever its schema: a node ignores those naming another schema (another
        deployment's jobs, `ChangeListener`)."""
        notice = f"{job_id} {origin} {change}"
        return notice if self.notice_scope is None else f"{notice} {self.notice_scope}"

    def load_notice_scope(self) -> str | None:
        """Read the schema this store's tables live in (PostgreSQL's `current_schema()` on a connection of
        the store) into `notice_scope`, and return it; None on other databases. Whoever publishes calls it
        once first: the runtime as it starts, the CLI before its cancel's notice."""
        self.notice_scope = self._engine.load_notice_scope()
        return self.notice_scope

    def publishing(
        self, job_id: str, origin: str, change: Change, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run the write method `fn`; each write transaction it commits publishes that `job_id` changed
        (as `publish` does, with `change` for the kind) once it has committed: no notice for a change that
        rolled back, and none sent by the write's own transaction (PostgreSQL serialises the commits of
        those that notify). Only on PostgreSQL; elsewhere it just runs `fn`."""
        return self._engine.publishing(job_id, origin, change, fn, *args, **kwargs)

    # -- progress and status -----------------------------------------------

    def set_progress(
        self, job_id: str, owner: str, done: float | None, total: float | None, message: str | None
    ) -> bool:
        """Store a running job's progress report, if `owner` still holds its lease and it is active; True when
        stored. One statement, compiled once, on the driver's own connection (a job reporting progress writes
        every `progress_flush_seconds`): on PostgreSQL in autocommit, one round trip, its change notice
        (`publishing`) queued only when the row changed."""
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
        """Move a job to `target` if the transition table allows it from its current status.

        `owner` additionally requires that lease holder; `lease_expired` requires
        the lease to have run out (recovery must not race a renewal). Terminal
        targets release the lease, stamp `finished_at` and shorten the retention
        to `keep_result_seconds`. Returns whether this call made the change
        (False: someone else won, or the edge is not allowed).
        """
        now = self.clock()
        return self._engine.transition(job_id, target, owner, lease_expired, now, values)

    def _locked(self, session: Session, job_id: str) -> JobRecord | None:
        """The job row, locked for this write transaction (SQLite: BEGIN IMMEDIATE holds the lock)."""
        return session.get(JobRecord, job_id, with_for_update=self._engine.locks_rows)

    def settle_interrupted(
        self, job_id: str, owner: str, *, shutdown: bool, lease_expired: bool = False
    ) -> Status | None:
        """Settle a job whose run stopped before it ended; returns its new status (None: not ours to settle).

        One rule for every way a run stops (a graceful shutdown, or a lease that ran out
        because its process died): a job with a cancel request ends `cancelled`; a
        shutdown hands a `retry` job straight to any node, not counted as an attempt;
        a crashed `retry` job is queued again after a backoff while attempts remain;
        anything else ends `failed`, saying why.
        """
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
        """Let go of a job that waits for answers: no lease, no worker, until they arrive.

        Returns the job's status afterwards: `input_required` (parked; an answer makes it
        claimable again), `working` (every answer arrived meanwhile: it is queued to
        resume), `cancelled` (a cancel request arrived meanwhile), None (not held here).
        """
        now = self.clock()
        with self._writing() as session:
            job = self._locked(session, job_id)
            if job is None or job.lease_owner != owner or Status(job.status) not in ACTIVE:
                return None
            if job.cancel_requested_at is not None:
                message = _cancelled(job, " while it waited for an answer")
                _transitioned(job, Status.CANCELLED, now, {"status_message": message})
            else:
                _released(job, now, {"resuming": True, "run_after": self._lease_now_value(session, now)})
            session.add(job)
            return Status(job.status)

    def request_cancel(self, job_id: str, by: str | None = None) -> CancelOutcome | None:
        """Record a cancel request (and `by` whom, unless one was recorded before). A job no worker holds
        (queued, waiting to run again, or parked on a question) ends `cancelled` at once, its status message
        saying who asked and at what point; a running one is signalled."""
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
        """Ask a question. Returns the stored request if it was already answered (a replay), else None.

        The job moves to `input_required` in the same transaction, so the question
        and the status are visible together.
        """
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
        """Record answers for pending keys; unknown or answered keys are ignored.

        When no question is left pending the job returns to `working`.
        """
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
        """Record that step `name` starts, unless it is already known: (record, fresh).

        Not fresh: the step completed before (replay its result) or started without
        a recorded outcome (unknown). A failed step is started afresh, and so is a
        `repeatable` one (safe to run again) that started without a recorded outcome.

        `started_at` (when given; else now) makes the start safe to try again: a try that finds the step
        started with this very attempt and time finds its own earlier try, committed though its answer was
        lost (a database outage, `Store.write_report`), and answers fresh.

        Raises `LeaseLost` when `owner` no longer holds the job. A step's two writes run past the ORM
        session, whose unit of work cost ten times their statements (a job of many steps pays both writes
        in every step): on SQLite as the outcome's (`SqliteOps.transition`), statements compiled once in
        one write transaction on SQLite's own connection; on PostgreSQL as one statement
        (`PostgresOps.begin_step`), its own transaction in autocommit, one round trip past the write pool's
        ping, its change notice queued only when it started the step.
        """
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
        """Record a started step's outcome (its JSON result, or the error it raised).

        The lease holder writes it while the step is started. Raises `LeaseLost` when `owner` no longer
        holds the job: a stale worker never rewrites the ledger of a job that ended or moved on. One write
        of a stale worker is kept, before `LeaseLost`: the outcome of the step its own run started, given
        as `attempt`, while that step is still `started` with that attempt. Nobody else has decided it
        then (a later run that meets a started step does not start it again: it fails the job
        `step_unknown`, or records what its `recheck` finds), and only this run knows what happened. A
        node that stood still past its lease (a long pause, a suspended machine) while its step ran on a
        worker thread so leaves the ledger true, and a retry that reaches the step afterwards replays its
        result instead of failing. A step that is not started is left as it is.

        Past the ORM session, as `begin_step`; on PostgreSQL in one statement (`PostgresOps.finish_step`), its
        own transaction in autocommit: one round trip past the write pool's ping, its change notice queued
        only when it changed the step.
        """
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
        with self._hot_reading() as connection:
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
