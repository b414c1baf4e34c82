"""Core statements compiled once and run on the DB-API connection itself, for the hot paths."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import Any


class _Prepared:
    """A Core statement compiled once for one dialect, bound through SQLAlchemy's processors."""

    def __init__(self, statement: Any, dialect: Any, column_keys: Sequence[str] | None = None) -> None:
        compiled = statement.compile(dialect=dialect, column_keys=list(column_keys or ()) or None)
        self.sql: str = compiled.string
        self._positional = compiled.positiontup is not None
        # Each parameter's name, value key, processor and bound None; a constant has no key.
        self._names: list[str] = []
        self._binds: list[tuple[str | None, Callable[[Any], Any] | None, Any]] = []
        for name, bind in _parameters_in_order(compiled):
            process = bind.type.dialect_impl(dialect).bind_processor(dialect)
            self._names.append(name)
            if bind.unique and not bind.required:
                value = bind.effective_value
                self._binds.append((None, None, value if process is None else process(value)))
            else:
                self._binds.append((bind.key, process, _bound_none(process)))
        # A SELECT's columns; their result processors come at the first run (`_result_columns`).
        self._dialect = dialect
        self._types = [
            (column.name, column.type.dialect_impl(dialect))
            for column in getattr(statement, "selected_columns", ())
        ]
        self._column_names = tuple(name for name, _ in self._types)
        self._columns: list[Callable[[Any], Any] | None] | None = None
        self._nulls_pass = False

    def parameters(self, values: Mapping[str, Any]) -> Any:
        """The statement's parameters from `values`, each value processed once per type."""
        bound: dict[tuple[int, int], Any] = {}
        processed = []
        for name, process, unset in self._binds:
            if name is None:  # a constant of the statement, bound at compilation
                processed.append(unset)
                continue
            value = values[name]
            if process is None:
                processed.append(value)
            elif value is None and unset is not _PER_BIND:
                processed.append(unset)
            else:
                key = (id(process), id(value))
                if key not in bound:
                    bound[key] = process(value)
                processed.append(bound[key])
        if self._positional:
            return tuple(processed)
        return dict(zip(self._names, processed, strict=True))

    def rows(self, connection: Any, values: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Run the SELECT on the DB-API `connection`: every row (so its statement ends), by column name."""
        return self.named(self.positions(connection, values))

    def positions(self, connection: Any, values: Mapping[str, Any]) -> list[list[Any]]:
        """As `rows`, each row by position."""
        cursor = connection.execute(self.sql, self.parameters(values))
        try:
            return self.values(cursor.fetchall(), cursor.description)
        finally:
            cursor.close()

    def named(self, rows: list[list[Any]]) -> list[dict[str, Any]]:
        """Rows by position (`values`) as rows by column name."""
        return [dict(zip(self._column_names, row, strict=True)) for row in rows]

    def values(self, found: Sequence[Sequence[Any]], description: Sequence[Any]) -> list[list[Any]]:
        """The rows `found`, by position, through each column's result processor."""
        columns = self._columns or self._result_columns(description)
        if self._nulls_pass:
            return [
                [
                    value if value is None or process is None else process(value)
                    for process, value in zip(columns, row, strict=True)
                ]
                for row in found
            ]
        return [
            [
                value if process is None else process(value)
                for process, value in zip(columns, row, strict=True)
            ]
            for row in found
        ]

    def _result_columns(self, description: Sequence[Any]) -> list[Callable[[Any], Any] | None]:
        """Each column's result processor for the type the driver reports, made once."""
        processors = [
            impl.result_processor(self._dialect, reported[1])
            for (_, impl), reported in zip(self._types, description, strict=True)
        ]
        self._nulls_pass = all(process is None or _reads_null_as_none(process) for process in processors)
        self._columns = processors
        return processors


def _reads_null_as_none(process: Callable[[Any], Any]) -> bool:
    try:
        return process(None) is None
    except Exception:
        return False


def _parameters_in_order(compiled: Any) -> list[tuple[str, Any]]:
    """(name in the SQL, `BindParameter`) of each parameter, in order when positional."""
    if compiled.positiontup is not None:
        return [(name, compiled.binds[name]) for name in compiled.positiontup]
    return [(name, bind) for bind, name in compiled.bind_names.items()]


_PER_BIND: Any = object()
"""What `_bound_none` gives for a processor whose None is processed at each bind."""


def _bound_none(process: Callable[[Any], Any] | None) -> Any:
    """What `process` binds None as; `_PER_BIND` when not a plain immutable value."""
    if process is None:
        return None
    unset = process(None)
    return unset if unset is None or type(unset) in (str, bytes, int, float, bool) else _PER_BIND


class _DriverReads:
    """The hot reads' side of SQLAlchemy's `Connection` on the DB-API connection itself."""

    def __init__(self, connection: Any, prepare: Callable[[Any], _Prepared]) -> None:
        self._connection = connection
        self._prepare = prepare

    def execute(self, statement: Any, values: Mapping[str, Any]) -> _Mappings:
        return _Mappings(self._prepare(statement).rows(self._connection, values))


class _Mappings(list[dict[str, Any]]):
    def mappings(self) -> _Mappings:
        return self

    def first(self) -> dict[str, Any] | None:
        return self[0] if self else None


@functools.cache
def sqlite_json_missing() -> str | None:
    """Why this process's SQLite has no JSON functions, or None when it has."""
    connection = sqlite3.connect(":memory:")
    try:
        connection.execute("SELECT json_group_array(json_array(1, 'a', NULL))").fetchone()
    except sqlite3.OperationalError as exc:
        return (
            f"The SQLite library this Python uses ({sqlite3.sqlite_version}) has no JSON functions ({exc}): "
            "handles needs SQLite 3.38 or later, or an earlier one built with JSON1. Use a Python built "
            "with a newer SQLite, or PostgreSQL."
        )
    finally:
        connection.close()
    return None
