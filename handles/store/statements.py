"""The store's Core statements, each built once (building a statement costs more than SQLite takes to run it):
those both engines run alike, then PostgreSQL's one-statement writes, snapshot and start."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

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
from sqlalchemy import insert as sa_insert
from sqlalchemy import select as sa_select
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlmodel import Session

from handles.states import ACTIVE, TERMINAL, Status, sources_of
from handles.store.models import (
    _INPUTS,
    _JOBS,
    _STEPS,
    JOB_STATE_COLUMNS,
    STEP_STATE_COLUMNS,
    InputRequestRecord,
    JobState,
    Snapshot,
    StepState,
    UTCDateTime,
    _from_json,
    _utc_time,
)
from handles.store.rules import _CLEARED_ON_ENTERING

_DATABASE_NOW = func.now(type_=UTCDateTime())  # the database's clock, read as an aware UTC datetime
_JOB_BY_ID = sa_select(_JOBS).where(_JOBS.c.id == bindparam("job_id"))
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

# A write by a running job's lease holder: `job_id`, held by `owner`, still active.
_HELD_BY_OWNER = (
    _JOBS.c.id == bindparam("job_id"),
    _JOBS.c.lease_owner == bindparam("owner"),
    _JOBS.c.status.in_([literal(status.value) for status in sorted(ACTIVE)]),
)

# A durable step's statements; PostgreSQL's one-statement writes are built on them.
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
# A stale worker's outcome: only while the step is still started with its attempt.
_OWN_START = _STEPS.c.attempt == bindparam("attempt", type_=_STEPS.c.attempt.type)
_FINISH_STEP_LATE = _FINISH_STEP.where(_OWN_START)
_TOUCH_JOB = (
    update(_JOBS)
    .where(_JOBS.c.id == bindparam("job_id"))
    .values(updated_at=bindparam("now"), version=_JOBS.c.version + 1)
)

_INSERT_JOB = sa_insert(_JOBS)
_JOB_BY_IDEMPOTENCY_KEY = sa_select(_JOBS).where(
    _JOBS.c.principal_key == bindparam("principal_key"),
    _JOBS.c.principal == bindparam("principal"),
    _JOBS.c.kind == bindparam("kind"),
    _JOBS.c.idempotency_key == bindparam("idempotency_key"),
)
_INSERT_INPUT = sa_insert(_INPUTS)
_INPUT_COLUMNS = tuple(c.name for c in _INPUTS.columns)


# The snapshot's steps as one JSON array of `StepState` arrays (NULL on PostgreSQL when none).
_S = _STEPS.alias("s")
_STEP_STATE = tuple(_S.c[name] for name in STEP_STATE_COLUMNS)


def _steps_as_json(array: Any, aggregate: Any) -> Any:
    """The job's steps as `aggregate(array(...))`, typed JSON so they read back as a list."""
    steps = aggregate(array(*_STEP_STATE), type_=JSON)
    return sa_select(steps).where(_S.c.job_id == _JOBS.c.id).scalar_subquery()


def _step_states(arrays: Sequence[Sequence[Any]] | None) -> list[StepState]:
    """The steps `_steps_as_json` gives, in the order they started."""
    steps = [
        StepState(name, status, attempt, _utc_time(started_at), _utc_time(finished_at))
        for name, status, attempt, started_at, finished_at in arrays or ()
    ]
    steps.sort(key=lambda step: (step.started_at, step.name))
    return steps


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
_JOB_COLUMNS = tuple(c.name for c in _JOBS.columns)


def _pending(session: Session, job_id: str) -> list[InputRequestRecord]:
    """A job's unanswered questions as session objects (for writes that change them), in the order asked."""
    query = sa_select(InputRequestRecord).from_statement(_OPEN_QUESTIONS_OF_JOB)
    return list(session.scalars(query, {"job_id": job_id}))


@functools.cache
def _update_job(columns: tuple[str, ...]) -> Any:
    """UPDATE of a job's `columns` by id (parameters `set_<column>`), built once per set."""
    return (
        update(_JOBS)
        .where(_JOBS.c.id == bindparam("job_id"))
        .values({name: bindparam(f"set_{name}") for name in columns})
    )


# PostgreSQL's own statements, one each, each saying whether it changed something (`_touched`).
# A step's outcome, written while started if the job is `held`; the job touched when it was.
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


def _touched(touched: Any) -> Any:
    """How many rows the CTE `touched` changed, as the column `touched`."""
    return sa_select(func.count()).select_from(touched).scalar_subquery().label("touched")


_FINISH_STEP_IN_ONE = sa_select(_HELD_COUNT, _touched(_TOUCHED))

# A step's start: inserted unless `known` and not to start again (then by the conflict clause).
_KNOWN = (
    sa_select(_STEPS)
    .where(_STEPS.c.job_id == sa_select(_HELD.c.id).scalar_subquery(), _STEPS.c.name == bindparam("name"))
    .cte("known")
)
_STEP_VALUES = ("name", "status", "attempt", "started_at", "finished_at", "result", "error")


def _starts_again_in_sql(status: Any) -> Any:
    """`_starts_again` in SQL, with `repeatable` a parameter."""
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
_BEGIN_STEP_IN_ONE = sa_select(_HELD_COUNT, _touched(_STEP_TOUCHED), _KNOWN_STEP)

_PROGRESS_CTE = _PROGRESS.returning(_JOBS.c.id).cte("changed")
_PROGRESS_CHANGED = sa_select(_PROGRESS_CTE.c.id)

# The snapshot: the job's state, its open questions (only while it waits), its steps.
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


def _snapshot_in_one(connection: Connection, job_id: str) -> Snapshot:
    row = connection.execute(_SNAPSHOT_IN_ONE, {"job_id": job_id}).mappings().first()
    if row is None:
        return None, [], []
    job = JobState(**{name: row[name] for name in JOB_STATE_COLUMNS})
    pending = [_from_json(_INPUTS, InputRequestRecord, q) for q in row["handles_open_questions"] or ()]
    return job, pending, _step_states(row["handles_steps"])


# The start: `handles_start` (from the migrations), JSON columns as `json` parameters of their own.
_JOB_JSON = ("arguments", "result", "error", "trace_context")
_INPUT_JSON = ("requested_schema", "answer")
_START = text(
    "SELECT outcome, active, lease_expires_at, stored FROM handles_start(CAST(:job AS json), "
    "CAST(:arguments AS json), CAST(:result AS json), CAST(:error AS json), CAST(:trace_context AS json), "
    "CAST(:questions AS json), CAST(:schemas AS json[]), CAST(:answers AS json[]), :limit, :lease, NULL)"
).columns(
    column("outcome", Text()),
    column("active", Integer()),
    column("lease_expires_at", UTCDateTime()),
    column("stored", JSON()),
)


@functools.cache
def _transition_statement(
    target: Status, owned: bool, lease_by_database: bool | None, columns: tuple[str, ...]
) -> Any:
    """`transition`'s compare-and-set UPDATE, built once per shape of call."""
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
    return sa_select(_touched(changed))
