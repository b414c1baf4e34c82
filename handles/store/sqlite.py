"""The SQLite engine's way of executing the store's hot paths (`SqliteOps`): each statement compiled once
and run on SQLite's own DB-API connection (`sqlite_direct.py`), past SQLAlchemy's session and statement
execution, which cost several times what SQLite takes to run a short statement. A start's count and
insert, a job's outcome, a durable step's writes and a progress report each run in one `BEGIN IMMEDIATE`
transaction (`Database._sqlite_writing`: on the event loop when `Store` writes inline); the hot reads run on
the event loop's own read connection there (`Database._sqlite_reading`), else through SQLAlchemy.

SQLite has no server clock of its own, no row locks (`BEGIN IMMEDIATE` takes the whole database's write
lock), and no change notices: nodes on one SQLite file are one process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import bindparam, func, literal_column
from sqlalchemy import select as sa_select
from sqlalchemy.exc import IntegrityError

from handles.errors import LeaseLost
from handles.states import ACTIVE, Status
from handles.store.engines import Change, EngineHost
from handles.store.models import (
    Clock,
    InputRequestRecord,
    JobRecord,
    JobState,
    StepRecord,
    StepState,
    UTCDateTime,
)
from handles.store.rows import _INPUTS, _JOBS, _column_values, _detached, _rows
from handles.store.rules import (
    ActiveLimitReached,
    _may_transition,
    _own_start,
    _set_values,
    _starts_again,
    _transitioned,
)
from handles.store.sqlite_direct import _DriverReads, _Prepared, sqlite_json_missing
from handles.store.statements import (
    _FINISH_STEP,
    _FINISH_STEP_LATE,
    _INPUT_COLUMNS,
    _INPUT_REQUIRED,
    _INSERT_INPUT,
    _INSERT_JOB,
    _INSERT_STEP,
    _JOB_BY_IDEMPOTENCY_KEY,
    _JOB_COLUMNS,
    _JOB_LEASE,
    _JOB_STATE,
    _OPEN_QUESTIONS_OF_JOB,
    _PROGRESS,
    _RESTART_STEP,
    _RESTARTED,
    _STATE_WIDTH,
    _STEP_BY_NAME,
    _TOUCH_JOB,
    _step_states,
    _steps_as_json,
    _update_job,
)

P = ParamSpec("P")
T = TypeVar("T")


class SqliteOps:
    """The engine operations of `JobRepository` (`EngineOps`, engines.py) on an SQLite file."""

    has_clock = False
    """SQLite runs in this process: leases are judged by the repository's `clock`."""
    locks_rows = False
    """No row locks: a write transaction's `BEGIN IMMEDIATE` holds the database's write lock from the start."""
    publishes = False
    """No change notices: every node of an SQLite file is this process, told by `ChangeNotifier`."""
    starts_on_loop = False
    """A start runs on SQLite's own connection (inline on the loop, else a worker thread), never awaited."""

    def __init__(self, repo: EngineHost) -> None:
        self.repo = repo
        dialect = repo.engine.dialect
        missing = sqlite_json_missing()
        if missing is not None:
            raise RuntimeError(missing)
        # How a time read from SQLite's text comes back (the snapshot's steps, read as JSON).
        read_time = UTCDateTime().dialect_impl(dialect).result_processor(dialect, None)
        assert read_time is not None  # a TypeDecorator with `process_result_value` always has one
        self._time = read_time
        # A start runs these on SQLite's own connection (see `insert`).
        self._start = (
            _Prepared(_COUNT_ACTIVE, dialect),
            _Prepared(_INSERT_JOB, dialect, _JOB_COLUMNS),
            _Prepared(_INSERT_INPUT, dialect, _INPUT_COLUMNS),
        )

    @contextmanager
    def hot_reading(self) -> Iterator[Any]:
        """What the hot reads by key run on: on the event loop, SQLite's own connection (each statement compiled
        once, `_DriverReads`); read off the loop, a connection of `_fast_reading`."""
        repo = self.repo
        with repo._sqlite_reading() as raw:
            if raw is not None:
                yield _DriverReads(raw, repo._prepare)
                return
        with repo._fast_reading() as connection:
            yield connection

    def clock_offset(self, clock: Clock) -> timedelta:
        """No clock but `clock`: no offset."""
        return timedelta(0)

    def skip_locked(self, query: Any) -> Any:
        """`query` as a claim reads its candidates: as it is (the write lock keeps other writers out)."""
        return query

    def snapshot(self, job_id: str) -> tuple[JobState | None, list[InputRequestRecord], list[StepState]]:
        """`JobRepository.snapshot` on SQLite: one statement (`_SQLITE_SNAPSHOT`), and a second only while the
        job waits for answers."""
        repo = self.repo
        with repo._sqlite_reading() as raw:
            if raw is not None:
                # A poll on the event loop: the statement run straight on SQLite's connection and its row
                # read by position, with no layer between (each layer is paid cold, as a server's caches
                # are between two calls).
                prepared = repo._prepare(_SQLITE_SNAPSHOT)
                cursor = raw.execute(prepared.sql, prepared.parameters({"job_id": job_id}))
                try:
                    rows = prepared.values(cursor.fetchall(), cursor.description)
                finally:
                    cursor.close()
                job, steps = self._state(rows[0] if rows else None)
                if job is None or job.status != _INPUT_REQUIRED:
                    return job, [], steps
                reads: Any = _DriverReads(raw, repo._prepare)  # as `hot_reading` gives it here
                return job, _rows(reads, InputRequestRecord, _OPEN_QUESTIONS_OF_JOB, job_id), steps
        with self.hot_reading() as connection:
            found = connection.execute(_SQLITE_SNAPSHOT, {"job_id": job_id}).first()
            job, steps = self._state(found)
            if job is None or job.status != _INPUT_REQUIRED:
                return job, [], steps
            return job, _rows(connection, InputRequestRecord, _OPEN_QUESTIONS_OF_JOB, job_id), steps

    def _state(self, row: Sequence[Any] | None) -> tuple[JobState | None, list[StepState]]:
        """The job's state and steps from the snapshot's row (the job's state in `JobState`'s order, then its
        steps), or none without a row."""
        if row is None:
            return None, []
        return JobState(*row[:_STATE_WIDTH]), _step_states(row[_STATE_WIDTH], self._time)

    def insert(
        self,
        values: dict[str, Any],
        active_limit: int | None,
        questions: Sequence[InputRequestRecord],
        lease_seconds: float | None,
    ) -> tuple[JobRecord, bool]:
        """`JobRepository.insert` on SQLite: the job its idempotency key names, if there is one; else the count
        and the insert, compiled once, on SQLite's own connection in one `BEGIN IMMEDIATE` transaction
        (`_sqlite_writing`), past SQLAlchemy's session and statement execution, which cost several times what
        SQLite takes to run them. The values are bound as SQLAlchemy binds them (the same type processors:
        JSON, UTC times), so the row is the same. A lease is held for `lease_seconds` by the local clock, which
        the caller's values already say."""
        if values["idempotency_key"] is not None:
            existing = self._find_idempotent(values)
            if existing is not None:
                return existing, False
        count, insert_job, insert_input = self._start
        try:
            with self.repo._sqlite_writing() as connection:
                if active_limit is not None:
                    (active,) = connection.execute(count.sql, (values["principal_key"],)).fetchone()
                    if active >= active_limit:
                        raise ActiveLimitReached(int(active), active_limit)
                connection.execute(insert_job.sql, insert_job.parameters(values))
                if questions:
                    connection.executemany(
                        insert_input.sql,
                        [insert_input.parameters(_column_values(_INPUTS, q)) for q in questions],
                    )
            return _detached(JobRecord, values), True
        except IntegrityError:
            existing = self._find_idempotent(values) if values["idempotency_key"] is not None else None
            if existing is None:
                raise
            return existing, False

    def _find_idempotent(self, job: Mapping[str, Any]) -> JobRecord | None:
        """The job that `job`'s principal already started with its kind and idempotency key."""
        with self.repo._fast_reading() as connection:
            row = connection.execute(_JOB_BY_IDEMPOTENCY_KEY, dict(job)).mappings().first()
        return None if row is None else _detached(JobRecord, row)

    async def start_on_loop(
        self,
        values: dict[str, Any],
        notice: str | None,
        active_limit: int | None,
        questions: Sequence[InputRequestRecord],
        lease_seconds: float | None,
    ) -> tuple[JobRecord, bool]:
        """Never called: a start on SQLite is not awaited on the loop (`starts_on_loop` is False)."""
        raise RuntimeError("an SQLite store starts jobs with `insert`, not on the event loop")

    def publish(self, job_id: str, origin: str, change: Change) -> None:
        """No notice to send."""

    def load_notice_scope(self) -> str | None:
        """No notices, and so no scope for them."""
        return None

    def publishing(
        self, job_id: str, origin: str, change: Change, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run `fn`: no notice to send."""
        return fn(*args, **kwargs)

    def set_progress(self, values: Mapping[str, Any]) -> bool:
        """`JobRepository.set_progress` on SQLite: `_PROGRESS` in its own write transaction."""
        with self.repo._sqlite_writing() as connection:
            return self._execute(connection, _PROGRESS, values) == 1

    def transition(
        self,
        job_id: str,
        target: Status,
        owner: str | None,
        lease_expired: bool,
        now: datetime,
        values: Mapping[str, Any],
    ) -> bool:
        """`JobRepository.transition` on SQLite, past the ORM session's unit of work (a job's outcome write is
        part of every job's cost): the row read, the rules applied (`_may_transition`, `_transitioned`) and the
        changed columns written, by statements compiled once, in one `BEGIN IMMEDIATE` transaction on SQLite's
        own connection (`_sqlite_writing`), which holds the write lock from the start."""
        repo = self.repo
        with repo._sqlite_writing() as connection:
            rows = repo._prepare(_TRANSITION_READ).rows(connection, {"job_id": job_id})
            if not rows:
                return False
            before = rows[0]
            job = SimpleNamespace(**before)  # the row's values, changed by `_transitioned` as a model is
            if not _may_transition(job, target, owner, now if lease_expired else None):
                return False
            _transitioned(job, target, now, values)
            after = vars(job)
            # What `_transitioned` set, and what it changed of what was read.
            changed = tuple(
                name
                for name in _JOB_COLUMNS
                if name in after and (name in values or name not in before or after[name] != before[name])
            )
            self._execute(connection, _update_job(changed), {"job_id": job_id, **_set_values(after, changed)})
        return True

    def begin_step(
        self,
        values: dict[str, Any],
        repeatable: bool,
        owner: str,
        now: datetime,
        own: tuple[int, datetime] | None,
    ) -> tuple[StepRecord, bool]:
        """`JobRepository.begin_step` on SQLite: as `transition`, statements compiled once in one write
        transaction on SQLite's own connection."""
        repo = self.repo
        job_id, name = values["job_id"], values["name"]
        with repo._sqlite_writing() as connection:
            self._hold_lease(connection, job_id, owner)
            found = repo._prepare(_STEP_BY_NAME).rows(connection, {"job_id": job_id, "name": name})
            if found and not _starts_again(found[0]["status"], repeatable):
                known = _detached(StepRecord, found[0])
                return known, _own_start(known, own)
            if found:
                self._execute(connection, _RESTART_STEP, values | _set_values(values, _RESTARTED))
            else:
                self._execute(connection, _INSERT_STEP, values)
            self._execute(connection, _TOUCH_JOB, {"job_id": job_id, "now": now})
        return _detached(StepRecord, values), True

    def finish_step(self, values: Mapping[str, Any]) -> None:
        """`JobRepository.finish_step` on SQLite: as `begin_step`."""
        job_id, owner, attempt = values["job_id"], values["owner"], values["attempt"]
        with self.repo._sqlite_writing() as connection:
            held = self._holds_lease(connection, job_id, owner)
            finish = _FINISH_STEP if held else _FINISH_STEP_LATE
            if (held or attempt is not None) and self._execute(connection, finish, values) == 1:
                self._execute(connection, _TOUCH_JOB, values)
        if not held:
            raise LeaseLost(job_id)

    def _hold_lease(self, connection: Any, job_id: str, owner: str) -> None:
        """In a write transaction (whose `BEGIN IMMEDIATE` holds the write lock): raise `LeaseLost` unless
        `owner` holds the active job `job_id`."""
        if not self._holds_lease(connection, job_id, owner):
            raise LeaseLost(job_id)

    def _holds_lease(self, connection: Any, job_id: str, owner: str) -> bool:
        """`_hold_lease`'s question: does `owner` hold the active job `job_id`?"""
        rows = self.repo._prepare(_JOB_LEASE).rows(connection, {"job_id": job_id})
        return bool(rows) and rows[0]["lease_owner"] == owner and Status(rows[0]["status"]) in ACTIVE

    def _execute(self, connection: Any, statement: Any, values: Mapping[str, Any]) -> int:
        """Run a write `statement` compiled once (`_prepare`) on SQLite's own `connection`: the rows it
        changed."""
        prepared = self.repo._prepare(statement)
        cursor = connection.execute(prepared.sql, prepared.parameters(values))
        changed: int = cursor.rowcount
        cursor.close()
        return changed


# What `transition` on SQLite reads of the job: what its rules look at (`_may_transition`) and
# what they may change besides the values given (`_transitioned`); not the arguments, result or logs, which
# would be decoded from JSON only to be left as they are.
_TRANSITION_READ = sa_select(
    *(
        _JOBS.c[name]
        for name in (
            "status",
            "lease_owner",
            "lease_expires_at",
            "input_deadline",
            "abandon_at",
            "finished_at",
            "expires_at",
            "keep_result_seconds",
            "updated_at",
            "version",
        )
    )
).where(_JOBS.c.id == bindparam("job_id"))
# A principal's active jobs, counted by a start on SQLite: the statuses are written into the statement,
# because a prepared statement's parameters are positional and an expanding IN list is not.
_COUNT_ACTIVE = (
    sa_select(func.count())
    .select_from(_JOBS)
    .where(
        _JOBS.c.principal_key == bindparam("key"),
        _JOBS.c.status.in_([literal_column(f"'{status.value}'") for status in sorted(ACTIVE)]),
    )
)
# The progress snapshot on SQLite in one statement: the job's state, with its steps as one JSON array of
# arrays (`json_group_array`, SQLite 3.38+ or JSON1). A column's value is JSON text or a number there, and
# a time is SQLite's text, read back by the column type's own result processor.
_SQLITE_SNAPSHOT = sa_select(
    *_JOB_STATE, _steps_as_json(func.json_array, func.json_group_array).label("handles_steps")
).where(_JOBS.c.id == bindparam("job_id"))
