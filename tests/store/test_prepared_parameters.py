"""`_Prepared.parameters` binds every value as its column's bind processor does, one value at a time: with
None worked out once per parameter and a value shared by several parameters processed once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.dialects import postgresql, sqlite

from handles.store.sqlite_direct import _PER_BIND, _bound_none, _Prepared
from handles.store.statements import _INSERT_JOB, _JOB_COLUMNS
from tests.store.test_detached_rows import rows

DIALECTS = {"sqlite": sqlite.dialect(), "postgresql": postgresql.psycopg.dialect()}


def one_at_a_time(prepared: _Prepared, values: dict[str, Any]) -> list[Any]:
    """Each parameter through its own processor, as SQLAlchemy binds them (no value shared, None too)."""
    return [
        values[name] if process is None else process(values[name]) for name, process, _ in prepared._binds
    ]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_new_jobs_parameters_are_bound_one_value_at_a_time(dialect: str) -> None:
    prepared = _Prepared(_INSERT_JOB, DIALECTS[dialect], _JOB_COLUMNS)
    now = datetime(2026, 12, 3, 6, 0, 0, 123, tzinfo=UTC)
    values = rows()[0][1] | {
        "created_at": now,
        "updated_at": now,  # the same object as created_at: processed once
        "run_after": now,
        "expires_at": now + timedelta(days=1),  # another time
        "result": None,  # JSON columns left out
        "error": None,
        "trace_context": None,
        "arguments": {"seconds": 0, "when": "x"},
    }
    bound = prepared.parameters(values)
    expected = one_at_a_time(prepared, values)
    if dialect == "sqlite":
        assert bound == tuple(expected)
        assert bound[[name for name, _, _ in prepared._binds].index("error")] == "null", (
            "JSON's null, not NULL"
        )
    else:
        assert list(bound) == [name for name, _, _ in prepared._binds]
        assert [str(v) for v in bound.values()] == [str(v) for v in expected]


def test_none_is_worked_out_once_only_for_a_plain_value() -> None:
    assert _bound_none(None) is None
    assert _bound_none(lambda value: None) is None
    assert _bound_none(lambda value: "null") == "null"
    assert _bound_none(lambda value: []) is _PER_BIND, "a value of its own at each bind"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_constant_written_into_a_statement_is_bound_with_its_value(dialect: str) -> None:
    """A value compared with a column in the statement itself (an anonymous parameter, as the snapshot's
    `status == 'input_required'`) is bound at compilation; the caller gives only the named ones."""
    from sqlalchemy import bindparam
    from sqlalchemy import select as sa_select

    from handles.store.models import _JOBS

    statement = sa_select(_JOBS.c.id).where(
        _JOBS.c.status == "input_required", _JOBS.c.id == bindparam("job_id"), _JOBS.c.attempts > 2
    )
    prepared = _Prepared(statement, DIALECTS[dialect])
    bound = prepared.parameters({"job_id": "j1"})
    if dialect == "sqlite":
        assert prepared.sql.count("?") == 3 and bound == ("input_required", "j1", 2)
    else:
        assert bound == {"status_1": "input_required", "job_id": "j1", "attempts_1": 2}
        assert all(f"%({name})s" in prepared.sql for name in bound)
