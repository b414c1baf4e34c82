"""PostgreSQL's hot paths (`PostgresOps`): each write one statement in autocommit on psycopg's connection."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import Any

import anyio
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, IntegrityError

from handles.errors import LeaseLost
from handles.states import Status
from handles.store.engine import NOTICE, Database, as_sqlalchemy_error
from handles.store.models import (
    _INPUTS,
    _JOBS,
    _STEPS,
    InputRequestRecord,
    JobRecord,
    Snapshot,
    StepRecord,
    _column_values,
    _detached,
    _from_json,
    _json_document,
    _one,
)
from handles.store.rules import ActiveLimitReached, _own_start, _set_values
from handles.store.sqlite_direct import _DriverReads
from handles.store.statements import (
    _BEGIN_STEP_IN_ONE,
    _FINISH_STEP_IN_ONE,
    _INPUT_JSON,
    _JOB_BY_ID,
    _JOB_JSON,
    _PROGRESS_CHANGED,
    _START,
    _STEP_BY_NAME,
    _snapshot_in_one,
    _transition_statement,
)


class PostgresOps:
    """The hot paths of `JobRepository` on PostgreSQL."""

    def __init__(self, repo: Database) -> None:
        self.repo = repo

    def autocommit(self) -> AbstractContextManager[Any]:
        """psycopg's own connection from the read pool, in autocommit."""
        return self._connection(self.repo._read_engine)

    @contextmanager
    def writing_at_once(self) -> Iterator[Any]:
        """psycopg's own connection from the (pinged) write pool, in autocommit for the block."""
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
        """psycopg's own connection from `engine`'s pool; errors come out as SQLAlchemy's."""
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
        """The hot reads' connection: psycopg's own in autocommit, each statement compiled once."""
        with self.autocommit() as connection:
            yield _DriverReads(connection, self.repo._prepare)

    def snapshot(self, job_id: str) -> Snapshot:
        """`JobRepository.snapshot` in one statement."""
        with self.hot_reading() as connection:
            return _snapshot_in_one(connection, job_id)

    @staticmethod
    def matches(column: Any, pattern: Sequence[str | None]) -> Any:
        """`column` LIKE `pattern`: None any run of characters, each piece of text literally (escaped by `!`)."""
        like = "".join(
            "%" if piece is None else "".join(f"!{c}" if c in "%_!" else c for c in piece)
            for piece in pattern
        )
        return column.like(like, escape="!")

    def set_progress(self, values: Mapping[str, Any]) -> bool:
        """One statement in autocommit; its notice is queued only when the row changed."""
        with self.autocommit() as connection:
            changed = len(self.repo._prepare(_PROGRESS_CHANGED).rows(connection, values)) == 1
        if changed:
            self.repo.committed(NOTICE.get())
        return changed

    def begin_step(
        self, values: dict[str, Any], repeatable: bool, owner: str, own: tuple[int, datetime] | None
    ) -> tuple[StepRecord, bool]:
        """One statement in autocommit, queuing its notice only when it started the step."""
        call = {"repeatable": repeatable, "owner": owner, "now": values["started_at"]}
        outcome = self._in_one(_BEGIN_STEP_IN_ONE, values | call)
        if not outcome["held"]:
            raise LeaseLost(values["job_id"])
        if outcome["touched"]:
            return _detached(StepRecord, values), True
        if outcome["known"] is not None:
            known = _from_json(_STEPS, StepRecord, outcome["known"])
            return known, _own_start(known, own)
        # Started by a concurrent writer we waited for: our snapshot predates it, a read shows it.
        with self.autocommit() as connection:
            (stored,) = self.repo._prepare(_STEP_BY_NAME).rows(connection, values)
        known = _detached(StepRecord, stored)
        return known, _own_start(known, own)

    def finish_step(self, values: Mapping[str, Any]) -> None:
        """One statement in autocommit; `LeaseLost` when `owner` no longer holds the job."""
        if not self._in_one(_FINISH_STEP_IN_ONE, values)["held"]:
            raise LeaseLost(values["job_id"])

    def insert(
        self,
        values: dict[str, Any],
        active_limit: int | None,
        questions: Sequence[InputRequestRecord],
        lease_seconds: float | None,
    ) -> tuple[JobRecord, bool]:
        """One call of the SQL function `handles_start` in autocommit, retried once on a dropped connection."""
        notice = NOTICE.get()
        params = self._start_parameters(values, active_limit, questions, lease_seconds)
        for attempt in (1, 2):
            try:
                with self.autocommit() as connection:  # psycopg's own: autocommit, no ping
                    (row,) = self.repo._prepare(_START).rows(connection, params)
                return self._started(row, values, params, notice)
            except DBAPIError as exc:
                if attempt == 2 or not exc.connection_invalidated:
                    return self._own_earlier_try(exc, values, notice)
        raise AssertionError("a start is tried at most twice")

    async def start_on_loop(
        self,
        values: dict[str, Any],
        notice: str | None,
        active_limit: int | None,
        questions: Sequence[InputRequestRecord],
        lease_seconds: float | None,
    ) -> tuple[JobRecord, bool]:
        """`insert` awaited on one of the event loop's own connections, queuing `notice`."""
        import psycopg

        assert self.repo.loop_connections is not None
        params = self._start_parameters(values, active_limit, questions, lease_seconds)
        start = self.repo._prepare(_START)
        for attempt in (1, 2):
            try:
                async with self.repo.loop_connections.connection() as connection:
                    try:
                        cursor = await connection.execute(start.sql, start.parameters(params))
                        (row,) = start.named(start.values(await cursor.fetchall(), cursor.description))
                    except psycopg.Error as exc:
                        raise as_sqlalchemy_error(
                            self.repo.engine, exc, disconnect=connection.closed
                        ) from exc
                return self._started(row, values, params, notice)
            except DBAPIError as exc:
                if attempt == 2 or not exc.connection_invalidated:
                    if not isinstance(exc, IntegrityError):
                        raise  # as it is, not from a worker thread (there may be none free)
                    return await anyio.to_thread.run_sync(self._own_earlier_try, exc, values, notice)
        raise AssertionError("a start is tried at most twice")

    def _started(
        self, row: Mapping[str, Any], values: dict[str, Any], params: Mapping[str, Any], notice: str | None
    ) -> tuple[JobRecord, bool]:
        """(job, created) from `handles_start`'s row, queuing `notice` when the job was stored."""
        outcome, stored = row["outcome"], row["stored"]
        if outcome == "limit":
            raise ActiveLimitReached(int(row["active"]), int(params["limit"] or 0))
        if outcome == "existing":
            return _from_json(_JOBS, JobRecord, stored), False
        self.repo.committed(notice)
        if stored is not None:  # an earlier try of this start committed it
            return _from_json(_JOBS, JobRecord, stored), True
        if params["lease"] is not None:
            values["lease_expires_at"] = row["lease_expires_at"]
        return _detached(JobRecord, values), True

    def _start_parameters(
        self,
        values: Mapping[str, Any],
        active_limit: int | None,
        questions: Sequence[InputRequestRecord],
        lease_seconds: float | None,
    ) -> dict[str, Any]:
        """`handles_start`'s parameters for the job row `values`."""
        lease = lease_seconds if values["lease_owner"] is not None and self.repo.database_leases else None
        values = self.repo._by_database_clock(values)
        rows = [_column_values(_INPUTS, q) for q in questions]  # the questions asked as it starts
        plain = [{k: v for k, v in r.items() if k not in _INPUT_JSON} for r in rows]
        return {
            "job": _json_document({k: v for k, v in values.items() if k not in _JOB_JSON}),
            **{name: json.dumps(values[name]) for name in _JOB_JSON},
            "questions": _json_document(plain) if rows else None,
            "schemas": [json.dumps(r["requested_schema"]) for r in rows] if rows else None,
            "answers": [json.dumps(r["answer"]) for r in rows] if rows else None,
            "limit": active_limit,
            "lease": lease,
        }

    def _own_earlier_try(
        self, exc: DBAPIError, values: Mapping[str, Any], notice: str | None
    ) -> tuple[JobRecord, bool]:
        """After a start's last try met `exc`: the job as created when `exc` is the conflict with the row an
        earlier try of this very start stored (no other start has its fresh random id), else `exc` raised."""
        if isinstance(exc, IntegrityError):
            with self.hot_reading() as connection:
                stored = _one(connection, JobRecord, _JOB_BY_ID, values["id"])
            own = (values["principal_key"], values["kind"], values["created_at"])
            if stored is not None and (stored.principal_key, stored.kind, stored.created_at) == own:
                self.repo.committed(notice)
                return stored, True
        raise exc

    def transition(
        self, job_id: str, target: Status, owner: str | None, lease_expired: bool, values: Mapping[str, Any]
    ) -> bool:
        """One compare-and-set UPDATE in autocommit, so of two racing transitions exactly one wins."""
        columns = tuple(values)
        shape = (target, owner is not None, self.repo.database_leases if lease_expired else None, columns)
        params = {"job_id": job_id, "owner": owner, "now": self.repo.clock()} | _set_values(values, columns)
        return bool(self._in_one(_transition_statement(*shape), params)["touched"])

    def _in_one(self, statement: Any, values: Mapping[str, Any]) -> dict[str, Any]:
        """Run a one-statement write in autocommit: its one row, its notice queued when `touched`."""
        with self.writing_at_once() as connection:
            (outcome,) = self.repo._prepare(statement).rows(connection, values)
        if outcome["touched"]:
            self.repo.committed(NOTICE.get())
        return outcome
