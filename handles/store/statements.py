"""The store's Core statements that both engines run alike, each built once (building a statement costs more
than SQLite takes to run it)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import JSON, and_, bindparam, func, literal, update
from sqlalchemy import insert as sa_insert
from sqlalchemy import select as sa_select
from sqlmodel import Session, col, select

from handles.states import ACTIVE, Status
from handles.store.models import (
    JOB_STATE_COLUMNS,
    STEP_STATE_COLUMNS,
    InputRequestRecord,
    StepState,
    UTCDateTime,
)
from handles.store.rows import _INPUTS, _JOBS, _STEPS

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
_QUESTION_BY_KEY = sa_select(_INPUTS).where(
    _INPUTS.c.job_id == bindparam("job_id"), _INPUTS.c.key == bindparam("key")
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
    """The job's steps as `aggregate(array(...))`, typed JSON so the type's result processor reads it back as
    a list."""
    steps = aggregate(array(*_STEP_STATE), type_=JSON)
    return sa_select(steps).where(_S.c.job_id == _JOBS.c.id).scalar_subquery()


def _step_states(arrays: Sequence[Sequence[Any]] | None, time: Callable[[Any], Any]) -> list[StepState]:
    """The steps as `_steps_as_json` gives them, in the order they started (by name on a tie), each time read
    by `time`."""
    steps = [
        StepState(name, status, attempt, time(started_at), None if finished_at is None else time(finished_at))
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


def _pending_clause(job_id: str) -> tuple[Any, Any]:
    """(where, order by) of a job's unanswered questions, in the order asked."""
    where = and_(col(InputRequestRecord.job_id) == job_id, col(InputRequestRecord.answered_at).is_(None))
    return where, (col(InputRequestRecord.created_at), col(InputRequestRecord.key))


def _pending(session: Session, job_id: str) -> list[InputRequestRecord]:
    """A job's unanswered questions as session objects (for writes that change them)."""
    where, order = _pending_clause(job_id)
    return list(session.exec(select(InputRequestRecord).where(where).order_by(*order)))


@functools.cache
def _update_job(columns: tuple[str, ...]) -> Any:
    """UPDATE of a job's `columns` by id, built once per set of columns; SET parameters are named
    `set_<column>`, since a bound parameter may not take a column's own name there."""
    return (
        update(_JOBS)
        .where(_JOBS.c.id == bindparam("job_id"))
        .values({name: bindparam(f"set_{name}") for name in columns})
    )
