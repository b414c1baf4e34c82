"""The PostgreSQL engine's way of executing the store's hot paths (`PostgresOps`): each write that can be is one
statement, and so its own transaction, run in autocommit on psycopg's own connection past SQLAlchemy's
statement execution (`sqlite_direct._Prepared` compiles it once): a start (one call of the function
`handles_start`, on a worker thread or awaited on the event loop's own connections, `LoopConnections`), a
job's outcome (a compare-and-set UPDATE built from the transition table), a durable step's start and
outcome, a progress report, the snapshot. Each sends its change notice (`publishing`'s) by the same
statement, and only when it changed something (`_touched`).

PostgreSQL has a clock of its own (leases may be judged by it), row locks (a claim skips the rows another
worker holds) and change notices (`pg_notify` on `NOTIFY_CHANNEL`), which every node listens to.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, ParamSpec, TypeVar

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
    column,
    func,
    literal,
    literal_column,
    null,
    or_,
    text,
    update,
)
from sqlalchemy import select as sa_select
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlmodel import select

from handles.errors import LeaseLost
from handles.states import TERMINAL, Status, sources_of
from handles.store.engine import NOTICE, NOTIFY_CHANNEL, as_sqlalchemy_error
from handles.store.engines import Change, EngineHost
from handles.store.models import (
    JOB_STATE_COLUMNS,
    InputRequestRecord,
    JobRecord,
    JobState,
    StepRecord,
    StepState,
    UTCDateTime,
)
from handles.store.rows import (
    _INPUTS,
    _JOBS,
    _STEPS,
    _column_values,
    _detached,
    _from_json,
    _json_document,
    _utc_time,
)
from handles.store.rules import _CLEARED_ON_ENTERING, ActiveLimitReached, _own_start, _set_values
from handles.store.sqlite_direct import _DriverReads, _Prepared
from handles.store.statements import (
    _DATABASE_NOW,
    _FINISH_STEP,
    _HELD_BY_OWNER,
    _JOB_STATE,
    _OWN_START,
    _PROGRESS,
    _RESTARTED,
    _STEP_BY_NAME,
    _TOUCH_JOB,
    _step_states,
    _steps_as_json,
)

P = ParamSpec("P")
T = TypeVar("T")


class PostgresOps:
    """The engine operations of `JobRepository` (`EngineOps`, engines.py) on PostgreSQL."""

    has_clock = True
    """The database server's clock may judge leases, so that nodes with skewed clocks agree."""
    locks_rows = True
    """A write transaction locks the rows it reads to change (`FOR UPDATE`)."""
    publishes = True
    """Every change is told to every node by a notice (`pg_notify`), which each listens to."""

    def __init__(self, repo: EngineHost) -> None:
        self.repo = repo

    @contextmanager
    def hot_reading(self) -> Iterator[Any]:
        """What the hot reads by key run on: psycopg's own connection in autocommit (`_postgres_autocommit`),
        each statement compiled once (`_DriverReads`), past SQLAlchemy's statement execution (about a third
        of a round trip)."""
        with self.repo._postgres_autocommit() as connection:
            yield _DriverReads(connection, self.repo._prepare)

    def skip_locked(self, query: Any) -> Any:
        """`query` as a claim reads its candidates: the rows locked, skipping those another worker holds, so
        concurrent workers never wait on each other or take the same job."""
        return query.with_for_update(skip_locked=True)

    def snapshot(self, job_id: str) -> tuple[JobState | None, list[InputRequestRecord], list[StepState]]:
        """`JobRepository.snapshot` on PostgreSQL: one statement (`_SNAPSHOT_IN_ONE`), one round trip."""
        with self.hot_reading() as connection:
            return _snapshot_in_one(connection, job_id)

    @property
    def starts_on_loop(self) -> bool:
        """Whether a start may be awaited here, on this event loop (`start_on_loop`): on the loop its
        connections for starts belong to (`LoopConnections`)."""
        connections = self.repo.loop_connections
        return connections is not None and connections.usable()

    def publish(self, job_id: str, origin: str, change: Change) -> None:
        """`JobRepository.publish`: the notice, in a transaction of its own."""
        with self.repo._writing() as session:
            session.execute(select(func.pg_notify(NOTIFY_CHANNEL, self.repo.notice(job_id, origin, change))))

    def load_notice_scope(self) -> str | None:
        """The schema this store's tables live in (`current_schema()` on a connection of the store)."""
        with self.repo._read_engine.connect() as connection:
            schema = connection.execute(select(func.current_schema())).scalar()
        return None if schema is None else str(schema)

    def publishing(
        self, job_id: str, origin: str, change: Change, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """`JobRepository.publishing`: `fn` run with the notice set for every write transaction it commits."""
        token = NOTICE.set(self.repo.notice(job_id, origin, change))
        try:
            return fn(*args, **kwargs)
        finally:
            NOTICE.reset(token)

    def set_progress(self, values: Mapping[str, Any]) -> bool:
        """`JobRepository.set_progress` on PostgreSQL: one statement in autocommit, its change notice
        (`publishing`) sent by the same statement and only when the row changed, one round trip in all."""
        notice = NOTICE.get()
        statement = _PROGRESS_NOTICED if notice is not None else _PROGRESS_CHANGED
        with self.repo._postgres_autocommit() as connection:
            return len(self.repo._prepare(statement).rows(connection, {**values, "notice": notice})) == 1

    def begin_step(
        self,
        values: dict[str, Any],
        repeatable: bool,
        owner: str,
        now: datetime,
        own: tuple[int, datetime] | None,
    ) -> tuple[StepRecord, bool]:
        """`JobRepository.begin_step` on PostgreSQL: one statement (`_BEGIN_STEP_IN_ONE`), its own transaction
        in autocommit, one round trip past the write pool's ping, with the change notice sent by the
        statement only when it started the step."""
        return self._begin_step(values | {"repeatable": repeatable}, owner, now, own)

    def finish_step(self, values: Mapping[str, Any]) -> None:
        """`JobRepository.finish_step` on PostgreSQL: one statement (`_FINISH_STEP_IN_ONE`), its own transaction
        in autocommit: one round trip past the write pool's ping, with the change notice sent by the
        statement only when it changed the step."""
        if not self._in_one(_FINISH_STEP_IN_ONE, _FINISH_STEP_NOTICED, values)["held"]:
            raise LeaseLost(values["job_id"])

    def insert(
        self,
        values: dict[str, Any],
        active_limit: int | None,
        questions: Sequence[InputRequestRecord],
        lease_seconds: float | None,
    ) -> tuple[JobRecord, bool]:
        """`JobRepository.insert` on PostgreSQL: one call of the function `handles_start` (migrations 0011 and 0012), in
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
        start = self.repo._prepare(_START)
        for attempt in (1, 2):
            try:
                with self.repo._postgres_autocommit() as connection:  # psycopg's own: autocommit, no ping
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

    async def start_on_loop(
        self,
        values: dict[str, Any],
        notice: str | None,
        active_limit: int | None,
        questions: Sequence[InputRequestRecord],
        lease_seconds: float | None,
    ) -> tuple[JobRecord, bool]:
        """`insert` awaited on the event loop, where `starts_on_loop`: the same call of
        `handles_start` as `insert` makes on a worker thread, sent and answered on one of the loop's own
        connections (`LoopConnections`), with `notice` as the change notice its transaction sends (None: none).

        As on a worker thread, a call on a connection the server dropped is made once more on a fresh one
        (why that is safe: `insert`), and errors come out as SQLAlchemy's exceptions.
        """
        import psycopg

        assert self.repo.loop_connections is not None
        params = self._start_parameters(values, active_limit, questions, lease_seconds, notice)
        start = self.repo._prepare(_START)
        for attempt in (1, 2):
            try:
                async with self.repo.loop_connections.connection() as connection:
                    try:
                        row = await self._start_statement(connection, start, params)
                    except psycopg.Error as exc:
                        raise as_sqlalchemy_error(
                            self.repo.engine, exc, disconnect=connection.closed
                        ) from exc
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
        name), as `insert` and `start_on_loop` call it, with `notice` as the change notice to send."""
        lease = lease_seconds if values["lease_owner"] is not None and self.repo._database_leases else None
        values = self.repo._by_database_clock(values)
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
        stored = self.repo.get(values["id"])
        if stored is None or (stored.principal_key, stored.kind, stored.created_at) != (
            values["principal_key"],
            values["kind"],
            values["created_at"],
        ):
            return None
        return stored

    def transition(
        self,
        job_id: str,
        target: Status,
        owner: str | None,
        lease_expired: bool,
        now: datetime,
        values: Mapping[str, Any],
    ) -> bool:
        """`JobRepository.transition` on PostgreSQL: one compare-and-set UPDATE (`_transition_statement`), in autocommit on a
        connection of the write pool (pinged at checkout), with the change notice of `publishing` sent by
        the statement when it changed the job: one round trip past the ping. PostgreSQL re-checks the
        UPDATE's conditions on the newest version of a row another transaction changed meanwhile, so of
        two racing transitions exactly one wins, as with the row read `FOR UPDATE` before."""
        shape = (
            target,
            owner is not None,
            self.repo._database_leases if lease_expired else None,
            tuple(values),
        )
        parameters = {"job_id": job_id, "owner": owner, "now": now} | _set_values(values, tuple(values))
        outcome = self._in_one(
            _transition_statement(*shape, False), _transition_statement(*shape, True), parameters
        )
        return bool(outcome["touched"])

    def _begin_step(
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
        with self.repo._postgres_autocommit() as connection:
            (stored,) = self.repo._prepare(_STEP_BY_NAME).rows(connection, values)
        known = _detached(StepRecord, stored)
        return known, _own_start(known, own)

    def _in_one(self, plain: Any, noticed: Any, values: Mapping[str, Any]) -> dict[str, Any]:
        """A PostgreSQL write that is one statement, and so its own transaction: run in autocommit on a
        connection of the write pool, pinged at checkout (`_postgres_writing_at_once`); `noticed`, which
        also sends the change notice `publishing` gives, when there is one, else `plain`. Its one row."""
        notice = NOTICE.get()
        with self.repo._postgres_writing_at_once() as connection:
            (outcome,) = self.repo._prepare(plain if notice is None else noticed).rows(
                connection, {**values, "notice": notice}
            )
        return outcome


_NOTIFY = func.pg_notify(NOTIFY_CHANNEL, bindparam("notice", type_=Text()))

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

_PROGRESS_CTE = _PROGRESS.returning(_JOBS.c.id).cte("changed")
_PROGRESS_CHANGED = sa_select(_PROGRESS_CTE.c.id)
_PROGRESS_NOTICED = sa_select(_NOTIFY.label("noticed")).select_from(_PROGRESS_CTE)

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
