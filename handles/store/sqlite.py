"""SQLite's way of running the store's hot paths (`SqliteOps`), on SQLite's own connection."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from sqlalchemy import bindparam, func, literal_column
from sqlalchemy import select as sa_select
from sqlalchemy.exc import IntegrityError

from handles.errors import LeaseLost
from handles.states import ACTIVE, Status
from handles.store.engine import Database
from handles.store.models import (
    _INPUTS,
    _JOBS,
    InputRequestRecord,
    JobRecord,
    JobState,
    Snapshot,
    StepRecord,
    _column_values,
    _detached,
    _rows,
)
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


class SqliteOps:
    """The hot paths of `JobRepository` on an SQLite file."""

    def __init__(self, repo: Database) -> None:
        self.repo = repo
        dialect = repo.engine.dialect
        missing = sqlite_json_missing()
        if missing is not None:
            raise RuntimeError(missing)
        self._start = (
            _Prepared(_COUNT_ACTIVE, dialect),
            _Prepared(_INSERT_JOB, dialect, _JOB_COLUMNS),
            _Prepared(_INSERT_INPUT, dialect, _INPUT_COLUMNS),
        )

    @contextmanager
    def hot_reading(self) -> Iterator[Any]:
        """SQLite's own connection on the event loop, else a connection of `_fast_reading`."""
        repo = self.repo
        with repo._sqlite_reading() as raw:
            if raw is not None:
                yield _DriverReads(raw, repo._prepare)
                return
        with repo._fast_reading() as connection:
            yield connection

    def snapshot(self, job_id: str) -> Snapshot:
        """One statement, and a second only while the job waits for answers."""
        repo = self.repo
        with repo._sqlite_reading() as raw:
            if raw is not None:
                # On the event loop: run straight on SQLite's connection, its row read by position.
                rows = repo._prepare(_SQLITE_SNAPSHOT).positions(raw, {"job_id": job_id})
                reads: Any = _DriverReads(raw, repo._prepare)  # as `hot_reading` gives it here
                return self._snapshot_of(rows[0] if rows else None, reads, job_id)
        with self.hot_reading() as connection:
            return self._snapshot_of(
                connection.execute(_SQLITE_SNAPSHOT, {"job_id": job_id}).first(), connection, job_id
            )

    def _snapshot_of(self, row: Sequence[Any] | None, connection: Any, job_id: str) -> Snapshot:
        """The snapshot from its statement's `row`, the open questions read while the job waits."""
        if row is None:
            return None, [], []
        job = JobState(*row[:_STATE_WIDTH])
        steps = _step_states(row[_STATE_WIDTH])
        if job.status != _INPUT_REQUIRED:
            return job, [], steps
        return job, _rows(connection, InputRequestRecord, _OPEN_QUESTIONS_OF_JOB, job_id), steps

    def insert(
        self,
        values: dict[str, Any],
        active_limit: int | None,
        questions: Sequence[InputRequestRecord],
        lease_seconds: float | None,
    ) -> tuple[JobRecord, bool]:
        """The job its idempotency key names, else the count and the insert in one transaction."""
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

    @staticmethod
    def matches(column: Any, pattern: Sequence[str | None]) -> Any:
        """`column` GLOB `pattern` (case-sensitive, unlike SQLite's LIKE): None any run of characters, each
        piece of text literally (its wildcards and brackets as one-character sets)."""
        glob = "".join(
            "*" if piece is None else "".join(f"[{c}]" if c in "*?[" else c for c in piece)
            for piece in pattern
        )
        return column.op("GLOB")(glob)

    def set_progress(self, values: Mapping[str, Any]) -> bool:
        """`_PROGRESS` in its own write transaction."""
        with self.repo._sqlite_writing() as connection:
            return self._execute(connection, _PROGRESS, values) == 1

    def transition(
        self, job_id: str, target: Status, owner: str | None, lease_expired: bool, values: Mapping[str, Any]
    ) -> bool:
        """Read the row, apply the rules and write the changed columns, in one transaction."""
        repo, now = self.repo, self.repo.clock()
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
        self, values: dict[str, Any], repeatable: bool, owner: str, own: tuple[int, datetime] | None
    ) -> tuple[StepRecord, bool]:
        """As `transition`: in one write transaction on SQLite's own connection."""
        repo = self.repo
        job_id, name = values["job_id"], values["name"]
        with repo._sqlite_writing() as connection:
            if not self._holds_lease(connection, job_id, owner):
                raise LeaseLost(job_id)
            found = repo._prepare(_STEP_BY_NAME).rows(connection, {"job_id": job_id, "name": name})
            if found and not _starts_again(found[0]["status"], repeatable):
                known = _detached(StepRecord, found[0])
                return known, _own_start(known, own)
            if found:
                self._execute(connection, _RESTART_STEP, values | _set_values(values, _RESTARTED))
            else:
                self._execute(connection, _INSERT_STEP, values)
            self._execute(connection, _TOUCH_JOB, {"job_id": job_id, "now": values["started_at"]})
        return _detached(StepRecord, values), True

    def finish_step(self, values: Mapping[str, Any]) -> None:
        job_id, owner, attempt = values["job_id"], values["owner"], values["attempt"]
        with self.repo._sqlite_writing() as connection:
            held = self._holds_lease(connection, job_id, owner)
            finish = _FINISH_STEP if held else _FINISH_STEP_LATE
            if (held or attempt is not None) and self._execute(connection, finish, values) == 1:
                self._execute(connection, _TOUCH_JOB, values)
        if not held:
            raise LeaseLost(job_id)

    def _holds_lease(self, connection: Any, job_id: str, owner: str) -> bool:
        rows = self.repo._prepare(_JOB_LEASE).rows(connection, {"job_id": job_id})
        return bool(rows) and rows[0]["lease_owner"] == owner and Status(rows[0]["status"]) in ACTIVE

    def _execute(self, connection: Any, statement: Any, values: Mapping[str, Any]) -> int:
        """Run a write `statement` compiled once on SQLite's own `connection`; the rows it changed."""
        prepared = self.repo._prepare(statement)
        cursor = connection.execute(prepared.sql, prepared.parameters(values))
        changed: int = cursor.rowcount
        cursor.close()
        return changed


# What `transition` reads of the job: what its rules look at and may change, not the JSON columns.
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
# Statuses written in: parameters are positional, and an expanding IN list is not.
_COUNT_ACTIVE = (
    sa_select(func.count())
    .select_from(_JOBS)
    .where(
        _JOBS.c.principal_key == bindparam("key"),
        _JOBS.c.status.in_([literal_column(f"'{status.value}'") for status in sorted(ACTIVE)]),
    )
)
# The snapshot: the job's state, its steps as a JSON array of arrays (SQLite 3.38+ or JSON1).
_SQLITE_SNAPSHOT = sa_select(
    *_JOB_STATE, _steps_as_json(func.json_array, func.json_group_array).label("handles_steps")
).where(_JOBS.c.id == bindparam("job_id"))
