"""The PostgreSQL engine's way of executing the store's hot paths (`PostgresOps`): each write that can be is one
statement, and so its own transaction, run in autocommit on psycopg's own connection past SQLAlchemy's
statement execution (`sqlite_direct._Prepared` compiles it once): a start (one call of the function
`handles_start`, on a worker thread or awaited on the event loop's own connections, `LoopConnections`), a
job's outcome (a compare-and-set UPDATE built from the transition table), a durable step's start and
outcome, a progress report, the snapshot. Each queues its change notice (`publishing`'s) once it has
committed, and only when it changed something (`NoticeSender`, notices.py). The statements are
postgres_statements.py's.

PostgreSQL has a clock of its own (leases may be judged by it), row locks (a claim skips the rows another
worker holds) and change notices (`pg_notify` on `NOTIFY_CHANNEL`, sent after the writes commit), which every
node listens to.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, ParamSpec, TypeVar

import anyio
from sqlalchemy import Engine, func
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlmodel import select

from handles.errors import LeaseLost
from handles.states import Status
from handles.store.engine import NOTICE, as_sqlalchemy_error
from handles.store.engines import Change, EngineHost
from handles.store.models import (
    Clock,
    InputRequestRecord,
    JobRecord,
    JobState,
    StepRecord,
    StepState,
)
from handles.store.postgres_statements import (
    _BEGIN_STEP_IN_ONE,
    _FINISH_STEP_IN_ONE,
    _INPUT_JSON,
    _JOB_JSON,
    _PROGRESS_CHANGED,
    _START,
    _snapshot_in_one,
    _transition_statement,
)
from handles.store.rows import (
    _INPUTS,
    _JOBS,
    _STEPS,
    _column_values,
    _detached,
    _from_json,
    _json_document,
)
from handles.store.rules import ActiveLimitReached, _own_start, _set_values
from handles.store.sqlite_direct import _DriverReads, _Prepared
from handles.store.statements import _STEP_BY_NAME

P = ParamSpec("P")
T = TypeVar("T")


class PostgresOps:
    """The engine operations of `JobRepository` (`EngineOps`, engines.py) on PostgreSQL."""

    has_clock = True
    """The database server's clock may judge leases, so that nodes with skewed clocks agree."""
    locks_rows = True
    """A write transaction locks the rows it reads to change (`FOR UPDATE`)."""
    publishes = True
    """Every change is told to every node by a notice (`pg_notify`, once it has committed), which each listens to."""

    def __init__(self, repo: EngineHost) -> None:
        self.repo = repo

    def clock_offset(self, clock: Clock) -> timedelta:
        """How far the database server's clock is ahead of `clock` (`JobRepository.read_database_clock`): read
        between two readings of `clock`, on a connection already checked out."""
        with self.autocommit() as connection:
            before = clock()
            (database_now,) = connection.execute("SELECT clock_timestamp()").fetchone()
            after = clock()
        offset: timedelta = database_now - (before + (after - before) / 2)
        return offset

    @contextmanager
    def autocommit(self) -> Iterator[Any]:
        """psycopg's own connection from the read engine's pool (autocommit, no ping at checkout), for a
        statement that is its own transaction run past SQLAlchemy's statement execution (a start: one
        call of `handles_start`, whose execution through SQLAlchemy cost a third of the round trip).
        Its errors come out as SQLAlchemy's exceptions (`_connection`)."""
        with self._connection(self.repo._read_engine) as connection:
            yield connection

    @contextmanager
    def writing_at_once(self) -> Iterator[Any]:
        """psycopg's own connection from the write engine's pool, in autocommit for the block: for a write
        that is one statement, and so its own transaction, one round trip past the pool's ping (a job's
        outcome, `JobRepository.transition`; a step's start and outcome). The ping at checkout makes a
        write after a restart or a failover succeed at its first try (SQLAlchemy's own ping switches
        autocommit on and off the same way). Errors as `_connection` gives them."""
        with self._connection(self.repo.engine) as connection:
            connection.autocommit = True
            try:
                yield connection
            finally:
                with contextlib.suppress(Exception):  # a dropped connection: `_connection` tells
                    connection.autocommit = False

    @staticmethod
    @contextmanager
    def _connection(engine: Engine) -> Iterator[Any]:
        """psycopg's own connection from `engine`'s pool, back to the pool after (pinged at checkout when the
        pool pings: the write engine's, not the read engine's).

        Its errors come out as SQLAlchemy's exceptions, as from `engine.connect()` and `execute`: a
        connection the server dropped (a restart, a failover, an idle timeout) is a `DBAPIError` with
        `connection_invalidated` set, and, as SQLAlchemy's own `Connection` does then, every connection
        the pool made before it is replaced at its next checkout, so a second try gets a fresh one.
        """
        dialect = engine.dialect
        pooled: Any = None
        try:
            pooled = engine.raw_connection()
            yield pooled.driver_connection
        except dialect.loaded_dbapi.Error as exc:
            disconnect = pooled is not None and dialect.is_disconnect(exc, pooled.dbapi_connection, None)
            if disconnect:
                engine.pool._invalidate(pooled, exc)
            raise as_sqlalchemy_error(engine, exc, disconnect=disconnect) from exc
        finally:
            if pooled is not None and pooled.is_valid:
                pooled.close()  # back to the pool (which rolls back what is still open)

    @contextmanager
    def hot_reading(self) -> Iterator[Any]:
        """What the hot reads by key run on: psycopg's own connection in autocommit (`autocommit`),
        each statement compiled once (`_DriverReads`), past SQLAlchemy's statement execution (about a third
        of a round trip)."""
        with self.autocommit() as connection:
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
        """`JobRepository.publish`: the notice, queued to be sent (`NoticeSender`)."""
        self.repo.committed(self.repo.notice(job_id, origin, change))

    def load_notice_scope(self) -> str | None:
        """The schema this store's tables live in (`current_schema()` on a connection of the store)."""
        with self.repo._read_engine.connect() as connection:
            schema = connection.execute(select(func.current_schema())).scalar()
        return None if schema is None else str(schema)

    def publishing(
        self, job_id: str, origin: str, change: Change, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """`JobRepository.publishing`: `fn` run with the notice set for every write transaction it commits to queue."""
        token = NOTICE.set(self.repo.notice(job_id, origin, change))
        try:
            return fn(*args, **kwargs)
        finally:
            NOTICE.reset(token)

    def set_progress(self, values: Mapping[str, Any]) -> bool:
        """`JobRepository.set_progress` on PostgreSQL: one statement in autocommit, one round trip, its change
        notice (`publishing`) queued only when the row changed."""
        with self.autocommit() as connection:
            changed = len(self.repo._prepare(_PROGRESS_CHANGED).rows(connection, values)) == 1
        if changed:
            self.repo.committed(NOTICE.get())
        return changed

    def begin_step(
        self,
        values: dict[str, Any],
        repeatable: bool,
        owner: str,
        now: datetime,
        own: tuple[int, datetime] | None,
    ) -> tuple[StepRecord, bool]:
        """`JobRepository.begin_step` on PostgreSQL: one statement (`_BEGIN_STEP_IN_ONE`), its own transaction
        in autocommit, one round trip past the write pool's ping, its change notice queued only when it
        started the step."""
        return self._begin_step(values | {"repeatable": repeatable}, owner, now, own)

    def finish_step(self, values: Mapping[str, Any]) -> None:
        """`JobRepository.finish_step` on PostgreSQL: one statement (`_FINISH_STEP_IN_ONE`), its own transaction
        in autocommit: one round trip past the write pool's ping, its change notice queued only when it
        changed the step."""
        if not self._in_one(_FINISH_STEP_IN_ONE, values)["held"]:
            raise LeaseLost(values["job_id"])

    def insert(
        self,
        values: dict[str, Any],
        active_limit: int | None,
        questions: Sequence[InputRequestRecord],
        lease_seconds: float | None,
    ) -> tuple[JobRecord, bool]:
        """`JobRepository.insert` on PostgreSQL: one call of the function `handles_start` (migrations 0011 and 0012), in
        autocommit, on psycopg's own connection (`autocommit`), compiled once (`_Prepared`: its
        result columns through the same type processors as SQLAlchemy's), past SQLAlchemy's statement
        execution.

        The function takes the principal's advisory lock, checks the idempotency key and the active
        count, and inserts the job (its lease by the database's clock) and its questions, as one statement
        and so one transaction: one round trip instead of seven. Its change notice is queued once a start
        has stored the job (`_started`).

        No ping at checkout. A call on a connection the server dropped is made once more on a fresh
        one, and that is safe whether or not the first call reached the server: the job's id is a
        fresh random id made for this start alone, so a row with that id (and this principal, kind and
        creation time) can only be this start's own, committed by a try whose reply was lost; the
        function answers it as created and stores and counts nothing twice. A try that
        never ran stored nothing, so the second is the first.
        """
        notice = NOTICE.get()
        params = self._start_parameters(values, active_limit, questions, lease_seconds)
        start = self.repo._prepare(_START)
        for attempt in (1, 2):
            try:
                with self.autocommit() as connection:  # psycopg's own: autocommit, no ping
                    (row,) = start.rows(connection, params)
                break
            except DBAPIError as exc:
                if attempt == 2 or not exc.connection_invalidated:
                    if isinstance(exc, IntegrityError):
                        earlier = self._own_earlier_try(values)
                        if earlier is not None:
                            self.repo.committed(notice)
                            return earlier, True
                    raise
        return self._started(row, values, active_limit, params["lease"], notice)

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
        connections (`LoopConnections`), with `notice` as the change notice to queue once it stored the job
        (None: none).

        As on a worker thread, a call on a connection the server dropped is made once more on a fresh one
        (why that is safe: `insert`), and errors come out as SQLAlchemy's exceptions.
        """
        import psycopg

        assert self.repo.loop_connections is not None
        params = self._start_parameters(values, active_limit, questions, lease_seconds)
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
                            self.repo.committed(notice)
                            return earlier, True
                    raise
        return self._started(row, values, active_limit, params["lease"], notice)

    @staticmethod
    async def _start_statement(
        connection: Any, start: _Prepared, params: Mapping[str, Any]
    ) -> dict[str, Any]:
        """`start_on_loop`'s call of `handles_start` on the loop's `connection`: its one row."""
        cursor = await connection.execute(start.sql, start.parameters(params))
        (row,) = start.decode(await cursor.fetchall(), cursor.description)
        return row

    def _started(
        self,
        row: Mapping[str, Any],
        values: dict[str, Any],
        active_limit: int | None,
        lease: float | None,
        notice: str | None,
    ) -> tuple[JobRecord, bool]:
        """(job, created) from the row `handles_start` answered for the job row `values`, with `notice` queued
        when the job was stored by this start (or by a try of it whose reply was lost)."""
        outcome, stored = row["outcome"], row["stored"]
        if outcome == "limit":
            raise ActiveLimitReached(int(row["active"]), int(active_limit or 0))
        if outcome == "existing":
            return _from_json(_JOBS, JobRecord, stored), False
        self.repo.committed(notice)
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
    ) -> dict[str, Any]:
        """The values of `handles_start`'s parameters (`_START`) for the job row `values` (its columns by
        name), as `insert` and `start_on_loop` call it."""
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
        connection of the write pool (pinged at checkout), one round trip past the ping, with the change notice
        of `publishing` queued when it changed the job. PostgreSQL re-checks the
        UPDATE's conditions on the newest version of a row another transaction changed meanwhile, so of
        two racing transitions exactly one wins, as with the row read `FOR UPDATE` before."""
        shape = (
            target,
            owner is not None,
            self.repo._database_leases if lease_expired else None,
            tuple(values),
        )
        parameters = {"job_id": job_id, "owner": owner, "now": now} | _set_values(values, tuple(values))
        return bool(self._in_one(_transition_statement(*shape), parameters)["touched"])

    def _begin_step(
        self, values: dict[str, Any], owner: str, now: datetime, own: tuple[int, datetime] | None
    ) -> tuple[StepRecord, bool]:
        """`begin_step` on PostgreSQL: `_BEGIN_STEP_IN_ONE` in autocommit (`_in_one`)."""
        outcome = self._in_one(_BEGIN_STEP_IN_ONE, values | {"owner": owner, "now": now})
        if not outcome["held"]:
            raise LeaseLost(values["job_id"])
        if outcome["touched"]:
            return _detached(StepRecord, values), True
        if outcome["known"] is not None:
            known = _from_json(_STEPS, StepRecord, outcome["known"])
            return known, _own_start(known, own)
        # Started by a concurrent writer that the job's lock made the statement wait for: its snapshot,
        # taken before that wait, does not show the step, which a read now does.
        with self.autocommit() as connection:
            (stored,) = self.repo._prepare(_STEP_BY_NAME).rows(connection, values)
        known = _detached(StepRecord, stored)
        return known, _own_start(known, own)

    def _in_one(self, statement: Any, values: Mapping[str, Any]) -> dict[str, Any]:
        """A PostgreSQL write that is one statement, and so its own transaction: run in autocommit on a
        connection of the write pool, pinged at checkout (`writing_at_once`), the change notice
        `publishing` gives queued when it changed the job (`touched`). Its one row."""
        with self.writing_at_once() as connection:
            (outcome,) = self.repo._prepare(statement).rows(connection, values)
        if outcome["touched"]:
            self.repo.committed(NOTICE.get())
        return outcome
