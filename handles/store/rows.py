"""Stored rows as models and back, past the ORM session: the Core tables, a model's values for a Core insert,
detached models from Core rows, and PostgreSQL's JSON rows (`json_populate_record`, `row_to_json`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import Connection, Float
from sqlalchemy.orm import instrumentation

from handles.store.models import InputRequestRecord, JobRecord, StepRecord, UTCDateTime

_JOBS = JobRecord.__table__  # type: ignore[attr-defined]
_INPUTS = InputRequestRecord.__table__  # type: ignore[attr-defined]
_STEPS = StepRecord.__table__  # type: ignore[attr-defined]
M = TypeVar("M", JobRecord, InputRequestRecord, StepRecord)


def _column_values(table: Any, model: Any) -> dict[str, Any]:
    """A model's values by column name for a Core insert, read from the instance's dict where present (past
    the ORM's descriptors), else through them."""
    held = model.__dict__
    return {name: held[name] if name in held else getattr(model, name) for name in _COLUMN_NAMES[table.name]}


def _detached(model: type[M], row: Mapping[Any, Any]) -> M:
    """A detached model of a stored row, built as SQLAlchemy builds a loaded instance (past the attribute
    events `model_construct` fires); never added to a session. A row missing columns gets `model_construct`'s
    defaults."""
    if len(row) != len(model.model_fields):
        return model.model_construct(**row)
    instance: M = _MANAGERS[model].new_instance()
    instance.__dict__.update(row)
    object.__setattr__(instance, "__pydantic_fields_set__", set(row))
    return instance


def _rows(connection: Connection, model: type[M], statement: Any, job_id: str, **params: Any) -> list[M]:
    """The rows a prebuilt hot-read `statement` finds for `job_id`, as detached models."""
    result = connection.execute(statement, {"job_id": job_id, **params})
    return [_detached(model, row) for row in result.mappings()]


def _one(connection: Connection, model: type[M], statement: Any, job_id: str, **params: Any) -> M | None:
    row = connection.execute(statement, {"job_id": job_id, **params}).mappings().first()
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


def _converters(table: Any) -> dict[str, Callable[[Any], Any]]:
    """How each column of `table` comes back from `row_to_json`: times as ISO 8601, floats as numbers."""
    found: dict[str, Callable[[Any], Any]] = {}
    for column_ in table.columns:
        if isinstance(column_.type, UTCDateTime):
            found[column_.name] = _utc_time
        elif isinstance(column_.type, Float):
            found[column_.name] = float
    return found


def _utc_time(value: str) -> datetime:
    return datetime.fromisoformat(value).astimezone(UTC)


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


_CONVERTERS = {table.name: _converters(table) for table in (_JOBS, _INPUTS, _STEPS)}
_MODELS = (JobRecord, InputRequestRecord, StepRecord)
_MANAGERS: dict[type[Any], Any] = {model: instrumentation.manager_of_class(model) for model in _MODELS}
_COLUMN_NAMES = {
    table.name: tuple(column.name for column in table.columns) for table in (_JOBS, _INPUTS, _STEPS)
}
