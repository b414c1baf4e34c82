"""The stored shape (SQLModel tables, times as aware UTC), and rows as models and back past the ORM."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import JSON, Column, Connection, DateTime, Float, Index, LargeBinary, Text, UniqueConstraint
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import instrumentation
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in, aware UTC datetimes out; the tables' columns are `UTC_TIME`."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; use aware UTC datetimes")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class _SQLiteTimeText(TypeDecorator[datetime]):
    """`UTCDateTime` on SQLite: written and read as DATETIME text in one step, not the decorator's two."""

    impl = DateTime()
    cache_ok = True

    def bind_processor(self, dialect: Dialect) -> Callable[[Any], Any] | None:
        return _sqlite_time_text

    def result_processor(self, dialect: Dialect, _coltype: object) -> Callable[[Any], Any] | None:
        return _utc_time


UTC_TIME = UTCDateTime().with_variant(_SQLiteTimeText(), "sqlite")
"""The type of every time column: `UTCDateTime`, SQLite's variant its one-step text."""
_SQLITE_TIME = "%04d-%02d-%02d %02d:%02d:%02d.%06d"
"""How SQLAlchemy's SQLite DATETIME writes a time (its default storage format), in UTC."""


def _sqlite_time_text(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        raise ValueError("naive datetime given to the store; use aware UTC datetimes")
    t = value.astimezone(UTC)
    return _SQLITE_TIME % (t.year, t.month, t.day, t.hour, t.minute, t.second, t.microsecond)


def _utc_time(value: Any) -> Any:
    """A time read as text (SQLite's, or ISO 8601 in PostgreSQL's JSON) as aware UTC; None stays None."""
    if value is None:
        return None
    parsed = datetime.fromisoformat(value)
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


Clock = Callable[[], datetime]
"""Where the store reads the time (aware UTC): `utc_now`, unless a test injects a clock of its own."""


def utc_now() -> datetime:
    return datetime.now(UTC)


@functools.lru_cache(maxsize=4096)
def principal_key(principal: str) -> str:
    """The fixed-length key (SHA-256, hex) a principal is indexed by, so any length fits."""
    return hashlib.sha256(principal.encode()).hexdigest()


CLAIM_ENTRY_HEAD = "["
"""How a claim log entry begins; the attempt number follows (a claim's UPDATE computes it in SQL)."""


def claim_entry_tail(claimed_at: datetime, node: str) -> str:
    """A claim log entry's rest after its attempt: the line `[ATTEMPT,"CLAIMED_AT","NODE"]`."""
    return f',"{claimed_at.astimezone(UTC).isoformat()}",{_json_string(node)}]\n'


@functools.lru_cache(maxsize=64)
def _json_string(text: str) -> str:
    return json.dumps(text)


def claim_entry(attempt: int, claimed_at: datetime, node: str) -> str:
    """The claim log entry of a claim made in Python (a start that claims its job as it stores it)."""
    return f"{CLAIM_ENTRY_HEAD}{attempt}{claim_entry_tail(claimed_at, node)}"


@dataclass(frozen=True)
class Claim:
    """One claim of a job; `resumed` when it continued the attempt before it."""

    attempt: int
    node: str
    claimed_at: datetime
    resumed: bool


def claims_of(job: JobRecord) -> list[Claim]:
    """The job's claims in order, read from its claim log (empty for jobs claimed before the log existed)."""
    claims: list[Claim] = []
    for line in (job.claim_log or "").splitlines():
        attempt, claimed_at, node = json.loads(line)
        resumed = bool(claims) and claims[-1].attempt == attempt
        claims.append(Claim(attempt, node, datetime.fromisoformat(claimed_at), resumed))
    return claims


def _time(nullable: bool = False, index: bool = False) -> Any:
    return Field(default=None, sa_column=Column(UTC_TIME, nullable=nullable, index=index))


class JobRecord(SQLModel, table=True):
    """One job: its arguments, status, progress, lease, and outcome."""

    __tablename__ = "handles_jobs"
    __table_args__ = (
        UniqueConstraint("principal_key", "kind", "idempotency_key", name="uq_handles_jobs_idempotency"),
        Index("ix_handles_jobs_claim", "status", "lease_owner", "run_after"),
        Index("ix_handles_jobs_principal_key_status", "principal_key", "status"),
        # the operator console's keyset listing, newest first
        Index("ix_handles_jobs_created", "created_at", "id"),
        Index("ix_handles_jobs_kind_created", "kind", "created_at", "id"),
        Index("ix_handles_jobs_status_created", "status", "created_at", "id"),
    )

    id: str = Field(primary_key=True, max_length=64)
    kind: str = Field(index=True, max_length=128)
    # Any length: indexes and uniqueness use `principal_key`, its SHA-256 (see `principal_key()`).
    principal: str = Field(sa_column=Column(Text, nullable=False))
    principal_key: str = Field(default="", max_length=64)
    status: str = Field(max_length=20)
    status_message: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    arguments: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    arguments_digest: str = Field(max_length=64)
    idempotency_key: str | None = Field(default=None, max_length=200)
    result: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    error: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    progress_done: float | None = None
    progress_total: float | None = None
    attempts: int = 0
    # Handed back without failing: the next claim does not count a new attempt.
    resuming: bool = False
    version: int = 0
    created_at: datetime = _time()
    updated_at: datetime = _time()
    started_at: datetime | None = _time(nullable=True)
    finished_at: datetime | None = _time(nullable=True)
    expires_at: datetime = _time(index=True)
    run_after: datetime = _time()
    lease_owner: str | None = Field(default=None, max_length=128)
    lease_expires_at: datetime | None = _time(nullable=True)
    # One line per claim, appended by the claim's own write: see `claims_of`.
    claim_log: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    cancel_requested_at: datetime | None = _time(nullable=True)
    # The W3C trace context of the starting request: every attempt's span links back to it.
    trace_context: dict[str, str] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    # Who asked for the cancel: the job's principal, `operator:<name>` (the CLI), or `handles:<reason>`.
    cancel_requested_by: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    input_deadline: datetime | None = _time(nullable=True)
    abandon_at: datetime | None = _time(nullable=True)
    # Policies frozen at creation: any node can recover a job it could never run.
    on_interrupt: str = Field(default="fail", max_length=10)
    max_attempts: int = 1
    keep_result_seconds: float | None = None
    input_timeout_seconds: float | None = None
    abandon_after_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class JobState:
    """A job as the caller following it sees it: status, progress, times, what owner and kind checks need, and
    when its lease runs out; the snapshot reads only these columns."""

    id: str
    kind: str
    principal: str
    status: str
    status_message: str | None
    error: dict[str, Any] | None
    progress_done: float | None
    progress_total: float | None
    attempts: int
    version: int
    created_at: datetime
    updated_at: datetime
    expires_at: datetime
    abandon_at: datetime | None
    abandon_after_seconds: float | None
    # When its node's lease runs out: tells a caller the node has gone quiet, never who it is.
    lease_expires_at: datetime | None

    @classmethod
    def of(cls, job: JobRecord | JobState) -> JobState:
        """The state of a job read whole (or `job` itself)."""
        if isinstance(job, JobState):
            return job
        return cls(**{name: getattr(job, name) for name in JOB_STATE_COLUMNS})


JOB_STATE_COLUMNS = tuple(JobState.__dataclass_fields__)
"""The columns of the job's row a `JobState` holds, in its fields' order."""


class InputRequestRecord(SQLModel, table=True):
    """A question a job asked; `key` is unique over the job's life."""

    __tablename__ = "handles_input_requests"

    job_id: str = Field(primary_key=True, max_length=64)
    key: str = Field(primary_key=True, max_length=64)
    message: str = Field(sa_column=Column(Text, nullable=False))
    requested_schema: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    created_at: datetime = _time()
    answered_at: datetime | None = _time(nullable=True)
    answer: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    # Who answered: the job's principal, or `operator:<name>`.
    answered_by: str | None = Field(default=None, sa_column=Column(Text, nullable=True))


class StepRecord(SQLModel, table=True):
    """One durable step of a job (the operation ledger): started, then completed or failed, exactly once."""

    __tablename__ = "handles_steps"

    job_id: str = Field(primary_key=True, max_length=64)
    name: str = Field(primary_key=True, max_length=200)
    status: str = Field(max_length=20)
    attempt: int = 0
    started_at: datetime = _time()
    finished_at: datetime | None = _time(nullable=True)
    result: Any = Field(default=None, sa_column=Column(JSON, nullable=True))
    error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))


@dataclass(frozen=True, slots=True)
class StepState:
    """A durable step as a follower sees it, without its (possibly large) result or error."""

    name: str
    status: str
    attempt: int
    started_at: datetime
    finished_at: datetime | None


STEP_STATE_COLUMNS = tuple(StepState.__dataclass_fields__)
"""The columns of a step's row a `StepState` holds, in its fields' order."""

Snapshot = tuple[JobState | None, list[InputRequestRecord], list[StepState]]
"""What a progress poll reads of a job: its state (None when it is gone), its open questions, its steps."""


class ResultPartRecord(SQLModel, table=True):
    """One part of a job's result file; `file_id` names the attempt that wrote it."""

    __tablename__ = "handles_result_parts"

    job_id: str = Field(primary_key=True, max_length=64)
    file_id: str = Field(primary_key=True, max_length=32)
    part: int = Field(primary_key=True)
    data: bytes = Field(sa_column=Column(LargeBinary, nullable=False))


class AuditRecord(SQLModel, table=True):
    """The evidence of one deleted job, kept until `keep_until`."""

    __tablename__ = "handles_audit"

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(index=True, max_length=64)
    kind: str = Field(max_length=128)
    principal: str = Field(sa_column=Column(Text, nullable=False))
    archived_at: datetime = _time(index=True)
    keep_until: datetime = _time(index=True)
    evidence: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))


class SwitchRecord(SQLModel, table=True):
    """An operator switch as last set (`tasks`, or `paused:<job>`); turned off, its row stays."""

    __tablename__ = "handles_switches"

    name: str = Field(primary_key=True, max_length=200)
    engaged: bool = False
    reason: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    # The pause of a job kind: how long its refusal tells a caller to wait before retrying.
    retry_after_seconds: float | None = None
    changed_by: str = Field(sa_column=Column(Text, nullable=False))
    changed_at: datetime = _time()


# Stored rows as models and back, past the ORM session (PostgreSQL's JSON rows too).
_JOBS = JobRecord.__table__  # type: ignore[attr-defined]
_INPUTS = InputRequestRecord.__table__  # type: ignore[attr-defined]
_STEPS = StepRecord.__table__  # type: ignore[attr-defined]
M = TypeVar("M", JobRecord, InputRequestRecord, StepRecord)


def _column_values(table: Any, model: Any) -> dict[str, Any]:
    """A model's values by column name for a Core insert, past the ORM's descriptors."""
    held = model.__dict__
    return {name: held[name] if name in held else getattr(model, name) for name in _COLUMN_NAMES[table.name]}


def _detached(model: type[M], row: Mapping[Any, Any]) -> M:
    """A detached model of a stored row, built as SQLAlchemy builds a loaded instance."""
    if len(row) != len(model.model_fields):
        return model.model_construct(**row)
    instance: M = _MANAGERS[model].new_instance()
    instance.__dict__.update(row)
    object.__setattr__(instance, "__pydantic_fields_set__", set(row))
    return instance


def _rows(connection: Connection, model: type[M], statement: Any, job_id: str) -> list[M]:
    """The rows a prebuilt hot-read `statement` finds for `job_id`, as detached models."""
    result = connection.execute(statement, {"job_id": job_id})
    return [_detached(model, row) for row in result.mappings()]


def _one(connection: Connection, model: type[M], statement: Any, job_id: str) -> M | None:
    row = connection.execute(statement, {"job_id": job_id}).mappings().first()
    return None if row is None else _detached(model, row)


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; use aware UTC datetimes")
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not stored as JSON")


def _json_document(value: Any) -> str:
    """Column values as the JSON text a PostgreSQL function reads with `json_populate_record`."""
    return json.dumps(value, default=_json_value)


def _from_json(table: Any, model: type[M], row: Mapping[str, Any]) -> M:
    """A detached model from a row PostgreSQL gave as JSON (`row_to_json`)."""
    convert = _CONVERTERS[table.name]
    values: dict[str, Any] = {}
    for column_ in table.columns:
        value = row.get(column_.name)
        if value is not None and column_.name in convert:
            value = convert[column_.name](value)
        values[column_.name] = value
    return _detached(model, values)


_CONVERTERS: dict[str, dict[str, Callable[[Any], Any]]] = {
    table.name: {
        c.name: _utc_time if isinstance(c.type, UTCDateTime) else float
        for c in table.columns
        if isinstance(c.type, UTCDateTime | Float)
    }
    for table in (_JOBS, _INPUTS, _STEPS)
}
"""How each column's value comes back from `row_to_json`: times as ISO 8601, floats as numbers."""
_MODELS = (JobRecord, InputRequestRecord, StepRecord)
_MANAGERS: dict[type[Any], Any] = {model: instrumentation.manager_of_class(model) for model in _MODELS}
_COLUMN_NAMES = {
    table.name: tuple(column.name for column in table.columns) for table in (_JOBS, _INPUTS, _STEPS)
}
