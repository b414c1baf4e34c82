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

import functools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any, Literal, ParamSpec, TypeVar

import anyio
from sqlalchemy import (
    JSON,
    Boolean,
    Connection,
    Integer,
    Text,
    and_,
    bindparam,
    case,
    cast,
    column,
    func,
    literal,
    literal_column,
    null,
    or_,
    text,
    update,
)
from sqlalchemy import insert as sa_insert
from sqlalchemy import select as sa_select
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import configure_mappers
from sqlmodel import Session, col, select

from handles.backoff import backoff_seconds
from handles.errors import LeaseLost
from handles.outcomes import cancelled_message, failed
from handles.states import ACTIVE, TERMINAL, Status, can_transition, sources_of
from handles.store.engine import NOTICE, NOTIFY_CHANNEL, as_sqlalchemy_error, is_sqlite
from handles.store.housekeeping import Housekeeping
from handles.store.models import (
    CLAIM_ENTRY_HEAD,
    JOB_STATE_COLUMNS,
    STEP_STATE_COLUMNS,
    Clock,
    InputRequestRecord,
    JobRecord,
    JobState,
    StepRecord,
    StepState,
    UTCDateTime,
    claim_entry_tail,
    principal_key,
    utc_now,
)
from handles.store.operator_reads import OperatorReads
from handles.store.result_files import ResultFiles
from handles.store.rows import (
    _INPUTS,
    _JOBS,
    _STEPS,
    _column_values,
    _detached,
    _from_json,
    _json_document,
    _one,
    _rows,
    _utc_time,
)
from handles.store.sqlite_direct import _DriverReads, _Prepared, sqlite_json_missing
from handles.store.switch_rows import SwitchRows

P = ParamSpec("P")
T = TypeVar("T")
_DATABASE_NOW = func.now(type_=UTCDateTime())  # the database's clock, read as an aware UTC datetime
_VERSIONS_BATCH = 500  # ids per query when reading the versions of watched jobs

Change = Literal["changed", "queued", "reported"]
"""What a write did to a job, as its change notice says: `changed` (anything, its status included), `queued`
(and it now waits for a worker), `reported` (only what a running job reports on its way: a progress report,
a durable step's start or outcome; not its status, its lease, its questions, a cancel or its result)."""


class ActiveLimitReached(Exception):
    """The principal already has `limit` active jobs; nothing was stored."""

    def __init__(self, active: int, limit: int) -> None:
        super().__init__(f"{active} active jobs (limit {limit})")
        self.active = active
        self.limit = limit


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


class JobRepository(Housekeeping, OperatorReads, ResultFiles, SwitchRows):
    """Synchronous access to the job tables of one database (its engines and transactions: `Database`).

    The job's lifecycle is here; its parts of their own: `Housekeeping` (housekeeping.py),
    `OperatorReads` (operator_reads.py), `ResultFiles` (result_files.py) and `SwitchRows`
    (switch_rows.py)."""

    def __init__(self, url: str, *, clock: Clock = utc_now, lease_clock: str | None = None) -> None:
        """`lease_clock`: "database" judges and sets leases by the database server's clock (the default on
        PostgreSQL, so nodes with skewed clocks agree), "local" by `clock` (the default elsewhere, and
        whenever a test clock is injected)."""
        super().__init__(url)
        self.clock = clock
        if lease_clock is None:
            lease_clock = "database" if not is_sqlite(url) and clock is utc_now else "local"
        if lease_clock not in ("database", "local"):
            raise ValueError("lease_clock must be 'database' or 'local'")
        if lease_clock == "database" and is_sqlite(url):
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
        # Models built from Core rows (the hot reads) need their ORM mappers ready.
        configure_mappers()
        self._prepared: dict[Any, _Prepared] = {}  # the hot reads' statements, compiled (`_hot_reading`)
        # A start on SQLite runs these on SQLite's own connection (see `_insert_sqlite`).
        self._sqlite_start: tuple[_Prepared, _Prepared, _Prepared] | None = None
        if self.dialect == "sqlite":
            dialect = self._write_engine.dialect
            missing = sqlite_json_missing()
            if missing is not None:
                raise RuntimeError(missing)
            # How a time read from SQLite's text comes back (the snapshot's steps, read as JSON).
            read_time = UTCDateTime().dialect_impl(dialect).result_processor(dialect, None)
            assert read_time is not None  # a TypeDecorator with `process_result_value` always has one
            self._sqlite_time = read_time
            self._sqlite_start = (
                _Prepared(_COUNT_ACTIVE, dialect),
                _Prepared(_INSERT_JOB, dialect, _JOB_COLUMNS),
                _Prepared(_INSERT_INPUT, dialect, _INPUT_COLUMNS),
            )

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
        with self._postgres_autocommit() as connection:
            before = self.clock()
            (database_now,) = connection.execute("SELECT clock_timestamp()").fetchone()
            after = self.clock()
        self._clock_offset = database_now - (before + (after - before) / 2)
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

    @contextmanager
    def _hot_reading(self) -> Iterator[Any]:
        """What the hot reads by key (`_one`, `_rows`, the snapshot) run on, each statement compiled once and
        run past SQLAlchemy's statement execution (which costs several times SQLite's own work, and about
        a third of a PostgreSQL round trip, as for a start): on the event loop on an SQLite file, SQLite's
        own connection; on PostgreSQL, psycopg's own (`_postgres_autocommit`); elsewhere (an SQLite file
        read off the loop) a connection of `_fast_reading`."""
        with self._sqlite_reading() as raw:
            if raw is not None:
                yield _DriverReads(raw, self._prepare)
                return
        if self.dialect == "postgresql":
            with self._postgres_autocommit() as connection:
                yield _DriverReads(connection, self._prepare)
            return
        with self._fast_reading() as connection:
            yield connection

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
        with self._sqlite_reading() as raw:
            if raw is not None:
                # A poll on the event loop: the statement run straight on SQLite's connection and its row
                # read by position, with no layer between (each layer is paid cold, as a server's caches
                # are between two calls).
                prepared = self._prepare(_SQLITE_SNAPSHOT)
                cursor = raw.execute(prepared.sql, prepared.parameters({"job_id": job_id}))
                try:
                    rows = prepared.values(cursor.fetchall(), cursor.description)
                finally:
                    cursor.close()
                job, steps = self._sqlite_state(rows[0] if rows else None)
                if job is None or job.status != _INPUT_REQUIRED:
                    return job, [], steps
                reads: Any = _DriverReads(raw, self._prepare)  # as `_hot_reading` gives it here
                return job, _rows(reads, InputRequestRecord, _OPEN_QUESTIONS_OF_JOB, job_id), steps
        with self._hot_reading() as connection:
            if self.dialect == "postgresql":
                return _snapshot_in_one(connection, job_id)
            found = connection.execute(_SQLITE_SNAPSHOT, {"job_id": job_id}).first()
            job, steps = self._sqlite_state(found)
            if job is None or job.status != _INPUT_REQUIRED:
                return job, [], steps
            return job, _rows(connection, InputRequestRecord, _OPEN_QUESTIONS_OF_JOB, job_id), steps

    def _sqlite_state(self, row: Sequence[Any] | None) -> tuple[JobState | None, list[StepState]]:
        """The job's state and steps from the snapshot's row on SQLite (the job's state in `JobState`'s order,
        then its steps), or none without a row."""
        if row is None:
            return None, []
        return JobState(*row[:_STATE_WIDTH]), _step_states(row[_STATE_WIDTH], self._sqlite_time)

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
        values = _job_values(job)
        if self.dialect == "postgresql":
            return self._start(values, active_limit, questions, lease_seconds)
        if job.idempotency_key is not None:
            existing = self._find_idempotent(values)
            if existing is not None:
                return existing, False
        return self._insert_sqlite(values, active_limit, questions)

    def _insert_sqlite(
        self, values: dict[str, Any], active_limit: int | None, questions: Sequence[InputRequestRecord]
    ) -> tuple[JobRecord, bool]:
        """`insert` on SQLite: the count and the insert, compiled once, on SQLite's own connection in one
        `BEGIN IMMEDIATE` transaction (`_sqlite_writing`), past SQLAlchemy's session and statement
        execution, which cost several times what SQLite takes to run them. The values are bound as
        SQLAlchemy binds them (the same type processors: JSON, UTC times), so the row is the same."""
        assert self._sqlite_start is not None
        count, insert_job, insert_input = self._sqlite_start
        try:
            with self._sqlite_writing() as connection:
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

    def _start(
        self,
        values: dict[str, Any],
        active_limit: int | None,
        questions: Sequence[InputRequestRecord],
        lease_seconds: float | None,
    ) -> tuple[JobRecord, bool]:
        """`insert` on PostgreSQL: one call of the function `handles_start` (migrations 0011 and 0012), in
        autocommit, on psycopg's own connection (`_postgres_autocommit`), compiled once (`_Prepared`: its
        result columns through the same type processors as SQLAlchemy's), past SQLAlchemy's statement
        execution.

        The function takes the principal's advisory lock, checks the idempotency key and the active
        count, inserts the job (its lease by the database's clock) and its questions, and sends the
        change notice, as one statement and so one transaction: one round trip instead of seven.

        No ping at checkout. A call on a connection the server dropped is made once more on a fresh
        one, and that is safe whether or not the first call reached the server: the job's id is a
        fresh random id made for this start alone, so a row with that id (and this principal, kind and
        creation time) can only be this start's own, committed by a try whose reply was lost; the
        function answers it as created and stores, counts and notifies nothing twice. A try that
        never ran stored nothing, so the second is the first.
        """
        params = self._start_parameters(values, active_limit, questions, lease_seconds, NOTICE.get())
        start = self._prepare(_START)
        for attempt in (1, 2):
            try:
                with self._postgres_autocommit() as connection:  # psycopg's own: autocommit, no ping
                    (row,) = start.rows(connection, params)
                break
            except DBAPIError as exc:
                if attempt == 2 or not exc.connection_invalidated:
                    if isinstance(exc, IntegrityError):
                        earlier = self._own_earlier_try(values)
                        if earlier is not None:
                            return earlier, True
                    raise
        return self._started(row, values, active_limit, params["lease"])

    @property
    def starts_on_loop(self) -> bool:
        """Whether a start may be awaited here, on this event loop (`start_on_loop`): PostgreSQL, on the loop
        its connections for starts belong to (`LoopConnections`)."""
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
        """`insert` on PostgreSQL awaited on the event loop, where `starts_on_loop`: the same call of
        `handles_start` as `_start` makes on a worker thread, sent and answered on one of the loop's own
        connections (`LoopConnections`), with `notice` as the change notice its transaction sends (None: none).

        As on a worker thread, a call on a connection the server dropped is made once more on a fresh one
        (why that is safe: `_start`), and errors come out as SQLAlchemy's exceptions.
        """
        import psycopg

        assert self.loop_connections is not None
        values = _job_values(job)
        params = self._start_parameters(values, active_limit, questions, lease_seconds, notice)
        start = self._prepare(_START)
        for attempt in (1, 2):
            try:
                async with self.loop_connections.connection() as connection:
                    try:
                        row = await self._start_statement(connection, start, params)
                    except psycopg.Error as exc:
                        raise as_sqlalchemy_error(self.engine, exc, disconnect=connection.closed) from exc
                break
            except DBAPIError as exc:
                if attempt == 2 or not exc.connection_invalidated:
                    if isinstance(exc, IntegrityError):
                        earlier = await anyio.to_thread.run_sync(self._own_earlier_try, values)
                        if earlier is not None:
                            return earlier, True
                    raise
        return self._started(row, values, active_limit, params["lease"])

    @staticmethod
    async def _start_statement(
        connection: Any, start: _Prepared, params: Mapping[str, Any]
    ) -> dict[str, Any]:
        """`start_on_loop`'s call of `handles_start` on the loop's `connection`: its one row."""
        cursor = await connection.execute(start.sql, start.parameters(params))
        (row,) = start.decode(await cursor.fetchall(), cursor.description)
        return row

    def _started(
        self, row: Mapping[str, Any], values: dict[str, Any], active_limit: int | None, lease: float | None
    ) -> tuple[JobRecord, bool]:
        """(job, created) from the row `handles_start` answered for the job row `values`."""
        outcome, stored = row["outcome"], row["stored"]
        if outcome == "limit":
            raise ActiveLimitReached(int(row["active"]), int(active_limit or 0))
        if outcome == "existing":
            return _from_json(_JOBS, JobRecord, stored), False
        if stored is not None:  # an earlier try of this start committed it
            return _from_json(_JOBS, JobRecord, stored), True
        if lease is not None:
            values["lease_expires_at"] = row["lease_expires_at"]
        return _detached(JobRecord, values), True

    def _start_parameters(
        self,
        values: Mapping[str, Any],
        active_limit: int | None,
        questions: Sequence[InputRequestRecord],
        lease_seconds: float | None,
        notice: str | None,
    ) -> dict[str, Any]:
        """The values of `handles_start`'s parameters (`_START`) for the job row `values` (its columns by
        name), as `_start` and `start_on_loop` call it, with `notice` as the change notice to send."""
        lease = lease_seconds if values["lease_owner"] is not None and self._database_leases else None
        values = self._by_database_clock(values)
        params: dict[str, Any] = {
            "job": _json_document({k: v for k, v in values.items() if k not in _JOB_JSON}),
            **{name: json.dumps(values[name]) for name in _JOB_JSON},
            "questions": None,
            "schemas": None,
            "answers": None,
            "limit": active_limit,
            "lease": lease,
            "notice": notice,
        }
        if questions:
            rows = [_column_values(_INPUTS, q) for q in questions]
            params["questions"] = _json_document(
                [{k: v for k, v in r.items() if k not in _INPUT_JSON} for r in rows]
            )
            params["schemas"] = [json.dumps(r["requested_schema"]) for r in rows]
            params["answers"] = [json.dumps(r["answer"]) for r in rows]
        return params

    def _own_earlier_try(self, values: Mapping[str, Any]) -> JobRecord | None:
        """The row of this very start (same id, principal, kind, creation time), if a try of it committed."""
        stored = self.get(values["id"])
        if stored is None or (stored.principal_key, stored.kind, stored.created_at) != (
            values["principal_key"],
            values["kind"],
            values["created_at"],
        ):
            return None
        return stored

    def _find_idempotent(self, job: Mapping[str, Any]) -> JobRecord | None:
        """The job that `job`'s principal already started with its kind and idempotency key."""
        with self._fast_reading() as connection:
            row = connection.execute(_JOB_BY_IDEMPOTENCY_KEY, dict(job)).mappings().first()
        return None if row is None else _detached(JobRecord, row)

    # -- claiming and leases ----------------------------------------------

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
        """Whether a queued job of `kinds` is due now: one indexed read, no write lock. A dispatcher pass
        looks before it reserves slots for a claim (`claim_next`), so a pass that finds nothing holds no
        slot from a start meanwhile."""
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
        """Claim up to `limit` queued jobs of `kinds` for `owner`, taking turns between principals.

        Candidates are ranked by how many jobs their principal already runs (on every
        node) plus their place in that principal's own queue, then by age: one
        principal's backlog never keeps another's first job waiting. `held` (jobs this
        node runs, by principal key) and `share_limit` keep a principal at or under its
        share of this node's slots while another principal has work waiting; alone, a
        principal may use every slot. Ties go to the principal this node served least
        recently (`served`: principal key -> a rising serve counter). PostgreSQL locks the candidates with `SKIP
        LOCKED`, so concurrent workers never wait on each other or take the same job.
        """
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
        if self.dialect == "postgresql":
            rows = rows.with_for_update(skip_locked=True)
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

    def publish(self, job_id: str, origin: str, *, queued: bool = False) -> None:
        """Tell every node listening on PostgreSQL that `job_id` changed, or is queued for a worker.

        A no-op on other databases. The payload is `notice`'s.
        """
        if self.dialect != "postgresql":
            return
        with self._writing() as session:
            change: Change = "queued" if queued else "changed"
            session.execute(select(func.pg_notify(NOTIFY_CHANNEL, self.notice(job_id, origin, change))))

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
        if self.dialect != "postgresql":
            return None
        with self._read_engine.connect() as connection:
            schema = connection.execute(select(func.current_schema())).scalar()
        self.notice_scope = None if schema is None else str(schema)
        return self.notice_scope

    def publishing(
        self, job_id: str, origin: str, change: Change, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run the write method `fn`; each write transaction it commits publishes that `job_id` changed
        (as `publish` does, with `change` for the kind), in the same transaction: no round trips of its
        own, and no notice for a change that rolled back. Only on PostgreSQL; elsewhere it just runs `fn`."""
        if self.dialect != "postgresql":
            return fn(*args, **kwargs)
        token = NOTICE.set(self.notice(job_id, origin, change))
        try:
            return fn(*args, **kwargs)
        finally:
            NOTICE.reset(token)

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
                .values(lease_expires_at=_after(self._lease_now(now), lease_seconds))
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

    # -- progress and status -----------------------------------------------

    def set_progress(
        self, job_id: str, owner: str, done: float | None, total: float | None, message: str | None
    ) -> bool:
        """Store a running job's progress report, if `owner` still holds its lease and it is active; True when
        stored. One statement, compiled once, on the driver's own connection (a job reporting progress writes
        every `progress_flush_seconds`): on PostgreSQL in autocommit, its change notice (`publishing`) sent by
        the same statement and only when the row changed, one round trip in all."""
        values: dict[str, Any] = {"job_id": job_id, "owner": owner, "done": done, "total": total}
        values |= {"message": message, "now": self.clock()}
        if self.dialect == "postgresql":
            notice = NOTICE.get()
            statement = _PROGRESS_NOTICED if notice is not None else _PROGRESS_CHANGED
            with self._postgres_autocommit() as connection:
                return len(self._prepare(statement).rows(connection, values | {"notice": notice})) == 1
        with self._sqlite_writing() as connection:
            return self._execute(connection, _PROGRESS, values) == 1

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
        if self.dialect == "postgresql":
            return self._transition_in_one(job_id, target, owner, lease_expired, now, values)
        return self._transition_direct(job_id, target, owner, lease_expired, now, values)

    def _transition_in_one(
        self,
        job_id: str,
        target: Status,
        owner: str | None,
        lease_expired: bool,
        now: datetime,
        values: Mapping[str, Any],
    ) -> bool:
        """`transition` on PostgreSQL: one compare-and-set UPDATE (`_transition_statement`), in autocommit on a
        connection of the write pool (pinged at checkout), with the change notice of `publishing` sent by
        the statement when it changed the job: one round trip past the ping. PostgreSQL re-checks the
        UPDATE's conditions on the newest version of a row another transaction changed meanwhile, so of
        two racing transitions exactly one wins, as with the row read `FOR UPDATE` before."""
        shape = (target, owner is not None, self._database_leases if lease_expired else None, tuple(values))
        parameters = {"job_id": job_id, "owner": owner, "now": now} | _set_values(values, tuple(values))
        outcome = self._in_one(
            _transition_statement(*shape, False), _transition_statement(*shape, True), parameters
        )
        return bool(outcome["touched"])

    def _transition_direct(
        self,
        job_id: str,
        target: Status,
        owner: str | None,
        lease_expired: bool,
        now: datetime,
        values: Mapping[str, Any],
    ) -> bool:
        """`transition` on SQLite, past the ORM session's unit of work (a job's outcome write is part of every
        job's cost): the row read, the rules applied (`_may_transition`, `_transitioned`) and the changed
        columns written, by statements compiled once, in one `BEGIN IMMEDIATE` transaction on SQLite's
        own connection (`_sqlite_writing`), which holds the write lock from the start."""
        with self._sqlite_writing() as connection:
            rows = self._prepare(_TRANSITION_READ).rows(connection, {"job_id": job_id})
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

    def _locked(self, session: Session, job_id: str) -> JobRecord | None:
        """The job row, locked for this write transaction (SQLite: BEGIN IMMEDIATE holds the lock)."""
        return session.get(JobRecord, job_id, with_for_update=self.dialect != "sqlite")

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
        """Give a job back to the queue (a kind this node does not run, or a hand-over).

        `resuming`: the next claim continues the job without counting a new attempt. `run_after` (default:
        now, by the lease clock) is when it may be claimed again.
        """
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
            if target in TERMINAL:
                _transitioned(job, target, now, values)
            else:  # queued again: its status stays, its lease goes
                _released(job, now, values)
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
        in every step): on SQLite as the outcome's (`_transition_direct`), statements compiled once in
        one write transaction on SQLite's own connection; on PostgreSQL as one statement
        (`_BEGIN_STEP_IN_ONE`), its own transaction in autocommit, one round trip past the write pool's
        ping, with the change notice sent by the statement only when it started the step.
        """
        now = self.clock() if started_at is None else started_at
        values: dict[str, Any] = {"job_id": job_id, "name": name, "status": "started", "attempt": attempt}
        values |= {"started_at": now, "finished_at": None, "result": None, "error": None}
        own = None if started_at is None else (attempt, started_at)  # what an earlier try stored
        if self.dialect == "postgresql":
            return self._begin_step_in_one(values | {"repeatable": repeatable}, owner, now, own)
        with self._sqlite_writing() as connection:
            self._hold_lease(connection, job_id, owner)
            found = self._prepare(_STEP_BY_NAME).rows(connection, {"job_id": job_id, "name": name})
            if found and not _starts_again(found[0]["status"], repeatable):
                known = _detached(StepRecord, found[0])
                return known, _own_start(known, own)
            if found:
                self._execute(connection, _RESTART_STEP, values | _set_values(values, _RESTARTED))
            else:
                self._execute(connection, _INSERT_STEP, values)
            self._execute(connection, _TOUCH_JOB, {"job_id": job_id, "now": now})
        return _detached(StepRecord, values), True

    def _begin_step_in_one(
        self, values: dict[str, Any], owner: str, now: datetime, own: tuple[int, datetime] | None
    ) -> tuple[StepRecord, bool]:
        """`begin_step` on PostgreSQL: `_BEGIN_STEP_IN_ONE` in autocommit, with its change notice when
        `publishing` gives one."""
        outcome = self._in_one(_BEGIN_STEP_IN_ONE, _BEGIN_STEP_NOTICED, values | {"owner": owner, "now": now})
        if not outcome["held"]:
            raise LeaseLost(values["job_id"])
        if outcome["touched"]:
            return _detached(StepRecord, values), True
        if outcome["known"] is not None:
            known = _from_json(_STEPS, StepRecord, outcome["known"])
            return known, _own_start(known, own)
        # Started by a concurrent writer that the job's lock made the statement wait for: its snapshot,
        # taken before that wait, does not show the step, which a read now does.
        with self._postgres_autocommit() as connection:
            (stored,) = self._prepare(_STEP_BY_NAME).rows(connection, values)
        known = _detached(StepRecord, stored)
        return known, _own_start(known, own)

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

        Past the ORM session, as `begin_step`; on PostgreSQL in one statement (`_FINISH_STEP_IN_ONE`), its
        own transaction in autocommit: one round trip past the write pool's ping, with the change notice
        sent by the statement only when it changed the step.
        """
        now = self.clock()
        status = "failed" if error is not None else "completed"
        values = {"job_id": job_id, "owner": owner, "name": name, "now": now, "set_status": status}
        values |= {"set_result": result, "set_error": error, "set_finished_at": now, "attempt": attempt}
        if self.dialect == "postgresql":
            if not self._in_one(_FINISH_STEP_IN_ONE, _FINISH_STEP_NOTICED, values)["held"]:
                raise LeaseLost(job_id)
            return
        with self._sqlite_writing() as connection:
            held = self._holds_lease(connection, job_id, owner)
            finish = _FINISH_STEP if held else _FINISH_STEP_LATE
            if (held or attempt is not None) and self._execute(connection, finish, values) == 1:
                self._execute(connection, _TOUCH_JOB, values)
        if not held:
            raise LeaseLost(job_id)

    def _hold_lease(self, connection: Any, job_id: str, owner: str) -> None:
        """On SQLite, in a write transaction (whose `BEGIN IMMEDIATE` holds the write lock): raise `LeaseLost`
        unless `owner` holds the active job `job_id`."""
        if not self._holds_lease(connection, job_id, owner):
            raise LeaseLost(job_id)

    def _holds_lease(self, connection: Any, job_id: str, owner: str) -> bool:
        """`_hold_lease`'s question: does `owner` hold the active job `job_id`?"""
        rows = self._prepare(_JOB_LEASE).rows(connection, {"job_id": job_id})
        return bool(rows) and rows[0]["lease_owner"] == owner and Status(rows[0]["status"]) in ACTIVE

    def _in_one(self, plain: Any, noticed: Any, values: Mapping[str, Any]) -> dict[str, Any]:
        """A PostgreSQL write that is one statement, and so its own transaction: run in autocommit on a
        connection of the write pool, pinged at checkout (`_postgres_writing_at_once`); `noticed`, which
        also sends the change notice `publishing` gives, when there is one, else `plain`. Its one row."""
        notice = NOTICE.get()
        with self._postgres_writing_at_once() as connection:
            (outcome,) = self._prepare(plain if notice is None else noticed).rows(
                connection, {**values, "notice": notice}
            )
        return outcome

    def _execute(self, connection: Any, statement: Any, values: Mapping[str, Any]) -> int:
        """Run a write `statement` compiled once (`_prepare`) on the driver's own `connection`: the rows it
        changed."""
        prepared = self._prepare(statement)
        cursor = connection.execute(prepared.sql, prepared.parameters(values))
        changed: int = cursor.rowcount
        cursor.close()
        return changed

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


# The hot reads' statements, built once (building a statement costs more than SQLite runs it).
_JOB_BY_ID = sa_select(_JOBS).where(_JOBS.c.id == bindparam("job_id"))
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
_JOB_STATE = tuple(_JOBS.c[name] for name in JOB_STATE_COLUMNS)
_STATE_WIDTH = len(_JOB_STATE)
_INPUT_REQUIRED = Status.INPUT_REQUIRED.value
_STEPS_OF_JOB = sa_select(_STEPS).where(_STEPS.c.job_id == bindparam("job_id")).order_by(_STEPS.c.started_at)
_QUESTIONS_OF_JOB = (
    sa_select(_INPUTS)
    .where(_INPUTS.c.job_id == bindparam("job_id"))
    .order_by(_INPUTS.c.created_at, _INPUTS.c.key)
)
_OPEN_QUESTIONS_OF_JOB = _QUESTIONS_OF_JOB.where(_INPUTS.c.answered_at.is_(None))
_ANSWERS_OF_JOB = (
    sa_select(_INPUTS)
    .where(_INPUTS.c.job_id == bindparam("job_id"), _INPUTS.c.answered_at.is_not(None))
    .order_by(_INPUTS.c.key)
)
_QUESTION_BY_KEY = sa_select(_INPUTS).where(
    _INPUTS.c.job_id == bindparam("job_id"), _INPUTS.c.key == bindparam("key")
)

# A write by a running job's lease holder: the job `job_id`, held by `owner`, still active. And the change
# notice a one-statement write sends on PostgreSQL (`publishing`'s `notice`).
_HELD_BY_OWNER = (
    _JOBS.c.id == bindparam("job_id"),
    _JOBS.c.lease_owner == bindparam("owner"),
    _JOBS.c.status.in_([literal(status.value) for status in sorted(ACTIVE)]),
)
_NOTIFY = func.pg_notify(NOTIFY_CHANNEL, bindparam("notice", type_=Text()))

# A durable step's statements (`begin_step`, `finish_step`), built once: the job's lease and status, a step by
# name, the step inserted or started again (a failed one), its outcome written if it is started, and the job
# touched (`_touch`). On SQLite each runs alone in one transaction; PostgreSQL's one statement for each write
# (below) is built on them.
_JOB_LEASE = sa_select(_JOBS.c.lease_owner, _JOBS.c.status).where(_JOBS.c.id == bindparam("job_id"))
_STEP_KEY = (_STEPS.c.job_id == bindparam("job_id"), _STEPS.c.name == bindparam("name"))
_STEP_BY_NAME = sa_select(_STEPS).where(*_STEP_KEY)
_INSERT_STEP = sa_insert(_STEPS)
_RESTARTED = ("status", "attempt", "started_at", "finished_at", "result", "error")
_RESTART_STEP = (
    update(_STEPS).where(*_STEP_KEY).values({name: bindparam(f"set_{name}") for name in _RESTARTED})
)
_FINISH_STEP = (
    update(_STEPS)
    .where(*_STEP_KEY, _STEPS.c.status == literal("started"))
    .values({name: bindparam(f"set_{name}") for name in ("status", "result", "error", "finished_at")})
)
# A stale worker's outcome of the step its own run started (`finish_step`): only while that start is the
# step's last, that is, the step still started with the run's attempt.
_OWN_START = _STEPS.c.attempt == bindparam("attempt", type_=_STEPS.c.attempt.type)
_FINISH_STEP_LATE = _FINISH_STEP.where(_OWN_START)
_TOUCH_JOB = (
    update(_JOBS)
    .where(_JOBS.c.id == bindparam("job_id"))
    .values(updated_at=bindparam("now"), version=_JOBS.c.version + 1)
)

# A step's outcome on PostgreSQL in one statement: the job locked while `owner` holds it and it is active
# (`held`), the step's outcome written while it is started, and the job touched when it was; its result
# row says whether the lease was held. With the change notice, sent (by `pg_notify` over the touched
# rows) only when the step changed, once the statement commits.
_HELD = sa_select(_JOBS.c.id).where(*_HELD_BY_OWNER).with_for_update().cte("held")
_FINISHED = (
    _FINISH_STEP.where(or_(_STEPS.c.job_id == sa_select(_HELD.c.id).scalar_subquery(), _OWN_START))
    .returning(_STEPS.c.job_id)
    .cte("finished")
)
_TOUCHED = (
    _TOUCH_JOB.where(_JOBS.c.id.in_(sa_select(_FINISHED.c.job_id))).returning(_JOBS.c.id).cte("touched")
)
_HELD_COUNT = sa_select(func.count()).select_from(_HELD).scalar_subquery().label("held")


def _touched(touched: Any, *, noticed: bool) -> Any:
    """The rows the CTE `touched` changed (1 or 0), as the column `touched`; with `noticed`, the change notice
    (`notice`) sent for each of them."""
    counted = func.count(_NOTIFY) if noticed else func.count()
    return sa_select(counted).select_from(touched).scalar_subquery().label("touched")


_FINISH_STEP_IN_ONE = sa_select(_HELD_COUNT, _touched(_TOUCHED, noticed=False))
_FINISH_STEP_NOTICED = sa_select(_HELD_COUNT, _touched(_TOUCHED, noticed=True))

# A step's start on PostgreSQL in one statement: with the job `held` (as for an outcome), the step as stored
# (`known`), and the step inserted unless it is known and not failed (a failed one is started again by the
# insert's conflict clause, only while it is still failed), the job touched when it was. The result row
# says whether the lease was held, whether the step was started, and the known step (`row_to_json`).
_KNOWN = (
    sa_select(_STEPS)
    .where(_STEPS.c.job_id == sa_select(_HELD.c.id).scalar_subquery(), _STEPS.c.name == bindparam("name"))
    .cte("known")
)
_STEP_VALUES = ("name", "status", "attempt", "started_at", "finished_at", "result", "error")


def _starts_again(status: str, repeatable: bool) -> bool:
    """Whether `begin_step` starts a known step of `status` afresh: it failed, or it is safe to repeat and did
    not complete (an earlier run began it and never recorded its outcome)."""
    return status == "failed" or (repeatable and status != "completed")


def _starts_again_in_sql(status: Any) -> Any:
    """`_starts_again` in SQL, with `repeatable` a parameter (PostgreSQL's `begin_step` in one statement)."""
    repeatable = bindparam("repeatable", type_=Boolean())
    return or_(status == literal("failed"), and_(repeatable, status != literal("completed")))


_STARTED_STEP = pg_insert(_STEPS).from_select(
    ["job_id", *_STEP_VALUES],
    sa_select(_HELD.c.id, *(bindparam(name, type_=_STEPS.c[name].type) for name in _STEP_VALUES)).where(
        ~sa_select(_KNOWN.c.name).where(~_starts_again_in_sql(_KNOWN.c.status)).exists()
    ),
)
_STARTED = (
    _STARTED_STEP.on_conflict_do_update(
        index_elements=[_STEPS.c.job_id, _STEPS.c.name],
        set_={name: _STARTED_STEP.excluded[name] for name in _RESTARTED},
        where=_starts_again_in_sql(_STEPS.c.status),
    )
    .returning(_STEPS.c.job_id)
    .cte("started")
)
_STEP_TOUCHED = (
    _TOUCH_JOB.where(_JOBS.c.id.in_(sa_select(_STARTED.c.job_id))).returning(_JOBS.c.id).cte("step_touched")
)
_KNOWN_STEP = (
    sa_select(func.row_to_json(literal_column("known"), type_=JSON))
    .select_from(_KNOWN)
    .scalar_subquery()
    .label("known")
)
_BEGIN_STEP_IN_ONE = sa_select(_HELD_COUNT, _touched(_STEP_TOUCHED, noticed=False), _KNOWN_STEP)
_BEGIN_STEP_NOTICED = sa_select(_HELD_COUNT, _touched(_STEP_TOUCHED, noticed=True), _KNOWN_STEP)

# The start's statements, built once (building a statement costs more than SQLite runs it).
_INSERT_JOB = sa_insert(_JOBS)
_JOB_BY_IDEMPOTENCY_KEY = sa_select(_JOBS).where(
    _JOBS.c.principal_key == bindparam("principal_key"),
    _JOBS.c.principal == bindparam("principal"),
    _JOBS.c.kind == bindparam("kind"),
    _JOBS.c.idempotency_key == bindparam("idempotency_key"),
)
_INSERT_INPUT = sa_insert(_INPUTS)
_INPUT_COLUMNS = tuple(c.name for c in _INPUTS.columns)
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


# The progress snapshot's steps: each step's `StepState` columns as a JSON array, all of them in one JSON
# array (empty, or NULL on PostgreSQL, when there are none), in any order (`_step_states` sorts them).
# Only these columns: a step's result may be large, and a poll never shows it.
_S = _STEPS.alias("s")
_STEP_STATE = tuple(_S.c[name] for name in STEP_STATE_COLUMNS)


def _steps_as_json(array: Any, aggregate: Any) -> Any:
    """The job's steps as `aggregate(array(...))`, typed JSON: read back as a list by the type's own result
    processor, as every JSON column is (SQLite's text decoded; psycopg decodes PostgreSQL's itself)."""
    steps = aggregate(array(*_STEP_STATE), type_=JSON)
    return sa_select(steps).where(_S.c.job_id == _JOBS.c.id).scalar_subquery()


def _step_states(arrays: Sequence[Sequence[Any]] | None, time: Callable[[Any], Any]) -> list[StepState]:
    """The steps read as `_steps_as_json` gives them, in the order they started (by name where two started
    at once), each time read by `time`."""
    steps = [
        StepState(name, status, attempt, time(started_at), None if finished_at is None else time(finished_at))
        for name, status, attempt, started_at, finished_at in arrays or ()
    ]
    steps.sort(key=lambda step: (step.started_at, step.name))
    return steps


# A progress report (`set_progress`): the job's progress, message and time, if `owner` holds its lease and it
# is active. On PostgreSQL as a CTE whose SELECT gives a row per changed job, and with the change notice sent
# by that SELECT, so only for a change (and, in autocommit, only once the statement commits).
_PROGRESS = (
    update(_JOBS)
    .where(*_HELD_BY_OWNER)
    .values(
        progress_done=bindparam("done"),
        progress_total=bindparam("total"),
        status_message=bindparam("message"),
        updated_at=bindparam("now"),
        version=_JOBS.c.version + 1,
    )
)
_PROGRESS_CTE = _PROGRESS.returning(_JOBS.c.id).cte("changed")
_PROGRESS_CHANGED = sa_select(_PROGRESS_CTE.c.id)
_PROGRESS_NOTICED = sa_select(_NOTIFY.label("noticed")).select_from(_PROGRESS_CTE)

# The progress snapshot on SQLite in one statement: the job's state, with its steps as one JSON array of
# arrays (`json_group_array`, SQLite 3.38+ or JSON1). A column's value is JSON text or a number there, and
# a time is SQLite's text, read back by the column type's own result processor.
_SQLITE_SNAPSHOT = sa_select(
    *_JOB_STATE, _steps_as_json(func.json_array, func.json_group_array).label("handles_steps")
).where(_JOBS.c.id == bindparam("job_id"))

# The progress snapshot on PostgreSQL in one statement (one round trip): the job's state, with its open
# questions (only while it waits for answers) as a JSON array in the order `_OPEN_QUESTIONS_OF_JOB` reads
# them, and its steps as `_steps_as_json` gives them (times as ISO 8601).
_Q = _INPUTS.alias("q")
_SNAPSHOT_IN_ONE = sa_select(
    *_JOB_STATE,
    case(
        (
            _JOBS.c.status == Status.INPUT_REQUIRED.value,
            sa_select(func.json_agg(aggregate_order_by(literal_column("q"), _Q.c.created_at, _Q.c.key)))
            .where(_Q.c.job_id == _JOBS.c.id, _Q.c.answered_at.is_(None))
            .scalar_subquery(),
        ),
        else_=None,
    ).label("handles_open_questions"),
    _steps_as_json(func.json_build_array, func.json_agg).label("handles_steps"),
).where(_JOBS.c.id == bindparam("job_id"))
_JOB_COLUMNS = tuple(c.name for c in _JOBS.columns)
# A new job's deadlines: judged by the lease clock, moved to the database's at a start (`_by_database_clock`).
_START_DEADLINES = ("run_after", "expires_at", "abandon_at", "input_deadline")


def _snapshot_in_one(
    connection: Connection, job_id: str
) -> tuple[JobState | None, list[InputRequestRecord], list[StepState]]:
    row = connection.execute(_SNAPSHOT_IN_ONE, {"job_id": job_id}).mappings().first()
    if row is None:
        return None, [], []
    job = JobState(**{name: row[name] for name in JOB_STATE_COLUMNS})
    pending = [_from_json(_INPUTS, InputRequestRecord, q) for q in row["handles_open_questions"] or ()]
    return job, pending, _step_states(row["handles_steps"], _utc_time)


# The start on PostgreSQL: one call of the function of migrations 0011 and 0012.
# Its JSON columns travel as `json` parameters of their own (see the migration), as SQLAlchemy's JSON
# type writes them (None as JSON null).
_JOB_JSON = ("arguments", "result", "error", "trace_context")
_INPUT_JSON = ("requested_schema", "answer")
_START = text(
    "SELECT outcome, active, lease_expires_at, stored FROM handles_start(CAST(:job AS json), "
    "CAST(:arguments AS json), CAST(:result AS json), CAST(:error AS json), CAST(:trace_context AS json), "
    "CAST(:questions AS json), CAST(:schemas AS json[]), CAST(:answers AS json[]), :limit, :lease, :notice)"
).columns(
    column("outcome", Text()),
    column("active", Integer()),
    column("lease_expires_at", UTCDateTime()),
    column("stored", JSON()),
)


def _pending_clause(job_id: str) -> tuple[Any, Any]:
    """(where, order by) of a job's unanswered questions, in the order asked."""
    where = and_(col(InputRequestRecord.job_id) == job_id, col(InputRequestRecord.answered_at).is_(None))
    return where, (col(InputRequestRecord.created_at), col(InputRequestRecord.key))


def _pending(session: Session, job_id: str) -> list[InputRequestRecord]:
    """A job's unanswered questions as session objects (for writes that change them)."""
    where, order = _pending_clause(job_id)
    return list(session.exec(select(InputRequestRecord).where(where).order_by(*order)))


def _own_start(step: StepRecord, own: tuple[int, datetime] | None) -> bool:
    """Whether the stored `step` is the start `own` (attempt, start time) itself, which an earlier try of
    `begin_step` given the same start time committed: still started, with that attempt and time."""
    return own is not None and (step.status, step.attempt, step.started_at) == ("started", *own)


def _claimable(now: Any) -> tuple[Any, ...]:
    """A job any worker may take `now` (by the lease clock, `_lease_now`): working, not leased, not being
    cancelled, due."""
    return (
        col(JobRecord.status) == Status.WORKING.value,
        col(JobRecord.lease_owner).is_(None),
        col(JobRecord.cancel_requested_at).is_(None),
        col(JobRecord.run_after) <= now,
    )


def _claimable_of(now: Any, kinds: Sequence[str]) -> tuple[Any, ...]:
    """A job any worker may take now (`_claimable`) of one of `kinds`: what a dispatcher pass looks for
    (`has_claimable`) and then claims from (`claim_next`)."""
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


# Built once: a claim is a hot path, and these parts of its UPDATE never change.
_CLAIMED_ATTEMPT = JobRecord.attempts + case((col(JobRecord.resuming), 0), else_=1)
_NEXT_VERSION = JobRecord.version + 1
_CLAIM_LOG_HEAD = (
    func.coalesce(col(JobRecord.claim_log), "") + CLAIM_ENTRY_HEAD + cast(_CLAIMED_ATTEMPT, Text)
)


def _claim_values(owner: str, now: datetime, lease_now: Any, lease_seconds: float) -> dict[str, Any]:
    """What a claim writes: the lease, one more attempt (unless it resumes), the first start time, and
    an entry (attempt, node, time) appended to the claim log."""
    return {
        "lease_owner": owner,
        "lease_expires_at": _after(lease_now, lease_seconds),
        "attempts": _CLAIMED_ATTEMPT,
        "claim_log": _CLAIM_LOG_HEAD + claim_entry_tail(now, owner),
        "resuming": False,
        "started_at": func.coalesce(JobRecord.started_at, now),
        "updated_at": now,
        "version": _NEXT_VERSION,
    }


def _interrupted_outcome(job: JobRecord, now: datetime, *, shutdown: bool) -> tuple[Status, dict[str, Any]]:
    """The status and fields that settle an interrupted job (see `JobRepository.settle_interrupted`); `now`
    by the lease clock, which judges when it is due again."""
    attempts = job.attempts
    if job.cancel_requested_at is not None:
        return Status.CANCELLED, {"status_message": _cancelled(job, "; its process stopped before it finished")}
    if job.on_interrupt == "retry" and shutdown:
        return Status.WORKING, {
            "status_message": "Its server is shutting down; another server continues it now.",
            "run_after": now,
            "resuming": True,
        }
    if job.on_interrupt == "retry" and attempts < job.max_attempts:
        delay = backoff_seconds(attempts, jitter=0, first=1, most=60)  # 1 s doubling to a minute
        return Status.WORKING, {
            "status_message": f"Interrupted during attempt {attempts}; retrying as attempt {attempts + 1} of "
            f"{job.max_attempts}.",
            "run_after": now + timedelta(seconds=delay),
        }
    cause = (
        "its server shut down before it finished and this job cannot be resumed"
        if shutdown
        else "the server process running it stopped before it finished"
        + (f" (after {attempts} attempts)" if attempts > 1 else "")
    )
    message = (
        f"The job was interrupted: {cause}. Its outcome is unknown; reconcile any external effects before "
        "starting it again."
    )
    return failed(message, "shutdown" if shutdown else "interrupted", attempts=attempts)


def _cancelled(job: JobRecord, when: str) -> str:
    """The status message of `job` cancelled `when`, saying who asked (`cancelled_message`)."""
    return cancelled_message(job.cancel_requested_by, job.principal, when)


def _waiting_as(job: JobRecord) -> str:
    """At what point a job no worker holds is: before its first run, parked on a question, or between runs."""
    if job.started_at is None:
        return " before it started"
    if Status(job.status) is Status.INPUT_REQUIRED:
        return " while it waited for an answer"
    return " while it waited to run again"


def _job_values(job: JobRecord) -> dict[str, Any]:
    """The row of a new job `job`, its columns by name, with its principal's key."""
    values = _column_values(_JOBS, job)
    values["principal_key"] = values["principal_key"] or principal_key(values["principal"])
    return values


def _may_transition(job: Any, target: Status, owner: str | None, lease_expired_by: datetime | None) -> bool:
    """Whether `transition` may move this job (a model, or a row's values) to `target`: the edge is in the
    table, `owner` (if given) holds the lease, and with `lease_expired_by` the lease ran out before it."""
    if not can_transition(Status(job.status), target):
        return False
    if owner is not None and job.lease_owner != owner:
        return False
    return lease_expired_by is None or (
        job.lease_expires_at is not None and job.lease_expires_at < lease_expired_by
    )


_LEASE = ("lease_owner", "lease_expires_at")
_CLEARED_ON_ENTERING: dict[Status, tuple[str, ...]] = {
    Status.WORKING: ("input_deadline",),
    Status.INPUT_REQUIRED: (),
    **{status: (*_LEASE, "input_deadline", "abandon_at") for status in TERMINAL},
}
"""What entering each status empties of a job's other columns: a job that ends holds no lease and has no
deadline left; one answered has no answer to wait for. A terminal status also stamps `finished_at` and
shortens the retention to `keep_result_seconds` from then. The Python rules (`_transitioned`) and the SQL
statement (`_transition_statement`) are both built from this table."""


def _transitioned(job: Any, target: Status, now: datetime, values: Mapping[str, Any]) -> None:
    """Move a job (a model, or a row's values) to `target`, by the transition table, with what entering
    `target` changes (`_CLEARED_ON_ENTERING`) and `values`. Every status change made in Python comes here;
    its caller has checked that the job may move (`_may_transition`, or an equivalent guard)."""
    source = Status(job.status)
    if not can_transition(source, target):
        raise ValueError(f"a job may not move from {source} to {target}")
    job.status = target.value
    for name in _CLEARED_ON_ENTERING[target]:
        setattr(job, name, None)
    if target in TERMINAL:
        job.finished_at = now
        if job.keep_result_seconds is not None:
            job.expires_at = min(job.expires_at, now + timedelta(seconds=job.keep_result_seconds))
    _changed(job, now, values)


def _released(job: Any, now: datetime, values: Mapping[str, Any]) -> None:
    """Give a job's lease back, its status unchanged (it is queued, or parked until an answer)."""
    _changed(job, now, dict.fromkeys(_LEASE) | dict(values))


def _changed(job: Any, now: datetime, values: Mapping[str, Any]) -> None:
    """Set `values` on a job and count the change (its `version`, which wakes long-polls)."""
    for name, value in values.items():
        setattr(job, name, value)
    _touch(job, now)


@functools.cache
def _update_job(columns: tuple[str, ...]) -> Any:
    """UPDATE of a job's `columns` by id (one statement per set of columns, built once): SET parameters
    are named `set_<column>`, since a bound parameter may not take a column's own name there."""
    return (
        update(_JOBS)
        .where(_JOBS.c.id == bindparam("job_id"))
        .values({name: bindparam(f"set_{name}") for name in columns})
    )


@functools.cache
def _transition_statement(
    target: Status, owned: bool, lease_by_database: bool | None, columns: tuple[str, ...], noticed: bool
) -> Any:
    """`transition`'s compare-and-set UPDATE on PostgreSQL, built once for each shape of call: the job moves to
    `target` from a status the transition table allows it from (`sources_of`), only while `owner` holds it
    when `owned`, and only once its lease ran out when `lease_by_database` is not None (by the database's
    clock when True, by `now` when False). It changes what `_transitioned` changes, from the same table
    (`_CLEARED_ON_ENTERING`), and `columns` to the values given (`set_<column>`). Its one row: how many jobs
    it changed (`_touched`), with the change notice sent for each when `noticed`. A test of both stores holds
    the two together (`tests/store/test_postgres_writes.py`)."""
    now = bindparam("now", type_=UTCDateTime())
    where = [
        _JOBS.c.id == bindparam("job_id"),
        _JOBS.c.status.in_([literal(source.value) for source in sorted(sources_of(target))]),
    ]
    if owned:
        where.append(_JOBS.c.lease_owner == bindparam("owner"))
    if lease_by_database is not None:
        where.append(_JOBS.c.lease_expires_at < (_DATABASE_NOW if lease_by_database else now))
    changes: dict[str, Any] = {"status": literal(target.value)}
    changes |= {name: null() for name in _CLEARED_ON_ENTERING[target]}
    if target in TERMINAL:
        kept = func.least(
            _JOBS.c.expires_at, now + func.make_interval(0, 0, 0, 0, 0, 0, _JOBS.c.keep_result_seconds)
        )
        changes |= {
            "finished_at": now,
            "expires_at": case((_JOBS.c.keep_result_seconds.is_(None), _JOBS.c.expires_at), else_=kept),
        }
    changes |= {name: bindparam(f"set_{name}", type_=_JOBS.c[name].type) for name in columns}
    changes |= {"updated_at": now, "version": _JOBS.c.version + 1}
    changed = update(_JOBS).where(*where).values(changes).returning(_JOBS.c.id).cte("changed")
    return sa_select(_touched(changed, noticed=noticed))


def _set_values(values: Mapping[str, Any], columns: Sequence[str]) -> dict[str, Any]:
    return {f"set_{name}": values[name] for name in columns}


def _touch(job: Any, now: datetime) -> None:
    job.updated_at = now
    job.version += 1


def _after(now: Any, seconds: float) -> Any:
    """`now` (a datetime, or the database's `now()`) plus `seconds`."""
    return now + timedelta(seconds=seconds)
