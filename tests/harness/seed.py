"""Job rows written straight into the store, in bulk: one SQL statement per 200,000 rows (a recursive CTE
on SQLite, `generate_series` on PostgreSQL), for tests and benchmarks that need many stored jobs.

Every seeded job is completed (1 attempt, a small stored result): the retention sweeper's and the
console's food, and the worst case for per-principal queries when it shares the caller's principal.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import create_engine, make_url, text

from tests.harness.database import own_connection

PRINCIPAL = "local:local"
RESULT = {
    "content": [{"type": "text", "text": '{"slept": 0.0, "mark": ""}'}],
    "structuredContent": {"slept": 0.0, "mark": ""},
    "isError": False,
}
CHUNK = 200_000


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def _expressions(
    dialect: str,
    *,
    kind: str,
    principal: str,
    id_prefix: str | None,
    first: int,
    created_at: datetime | None,
    expires_at: datetime | None,
) -> dict[str, str]:
    """SQL for each seeded column; `i` is the row number in its chunk (from 1), `first` the chunk's start."""
    from handles.store.models import principal_key

    now = datetime.now(UTC).replace(microsecond=0)
    if dialect == "sqlite":

        def stamp(moment: datetime) -> str:
            return _literal(
                moment.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")
            )

        ident = "lower(hex(randomblob(12)))"
        if id_prefix is not None:
            ident = f"{_literal(id_prefix)} || printf('%05d', i - 1 + {first})"
        as_json = _literal
    else:

        def stamp(moment: datetime) -> str:
            return _literal(moment.isoformat()) + "::timestamptz"

        ident = "md5(i::text || random()::text)"
        if id_prefix is not None:
            ident = f"{_literal(id_prefix)} || lpad((i - 1 + {first})::text, 5, '0')"

        def as_json(value: Any) -> str:
            return _literal(value) + "::json"

    created = created_at if created_at is not None else now - timedelta(minutes=30)
    return {
        "id": ident,
        "kind": _literal(kind),
        "principal": _literal(principal),
        "principal_key": _literal(principal_key(principal)),
        "status": _literal("completed"),
        "status_message": _literal("Completed."),
        "arguments": as_json(json.dumps({"seconds": 0.0, "mark": ""})),
        "arguments_digest": _literal("0" * 64),
        "idempotency_key": "NULL",
        "result": as_json(json.dumps(RESULT)),
        "error": as_json("null"),
        "attempts": "1",
        "version": "3",
        "created_at": stamp(created),
        "updated_at": stamp(created + timedelta(seconds=1)),
        "started_at": stamp(created),
        "finished_at": stamp(created + timedelta(seconds=1)),
        "expires_at": stamp(expires_at if expires_at is not None else now + timedelta(hours=6)),
        "run_after": stamp(created),
        "on_interrupt": _literal("fail"),
        "max_attempts": "1",
        "resuming": "FALSE" if dialect != "sqlite" else "0",
    }


def seed_jobs(
    database_url: str,
    count: int,
    *,
    kind: str = "work",
    principal: str = PRINCIPAL,
    id_prefix: str | None = None,
    created_at: datetime | None = None,
    expires_at: datetime | None = None,
) -> float:
    """Insert `count` completed jobs of `kind` for `principal` in bulk; returns the seconds it took.

    Ids are random, or `id_prefix` and the row's number on five digits (`old-00000`, `old-00001`, ...).
    The jobs were created `created_at` (30 minutes ago) and expire `expires_at` (in 6 hours).
    """
    from handles.store.models import JobRecord

    dialect = make_url(database_url).get_backend_name()
    engine = create_engine(database_url)
    started = time.perf_counter()
    try:
        done = 0
        while done < count:
            size = min(CHUNK, count - done)
            expressions = _expressions(
                dialect,
                kind=kind,
                principal=principal,
                id_prefix=id_prefix,
                first=done,
                created_at=created_at,
                expires_at=expires_at,
            )
            columns: list[str] = []
            values: list[str] = []
            for column in JobRecord.__table__.columns:  # type: ignore[attr-defined]
                if column.name in expressions:
                    columns.append(column.name)
                    values.append(expressions[column.name])
                elif not column.nullable and column.server_default is None:
                    raise RuntimeError(f"seed_jobs does not know how to seed the column {column.name}")
            column_list = ", ".join(columns)
            value_list = ", ".join(values)
            if dialect == "sqlite":
                sql = (
                    f"INSERT INTO handles_jobs ({column_list}) "
                    f"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {size}) "
                    f"SELECT {value_list} FROM n"
                )
            else:
                sql = (
                    f"INSERT INTO handles_jobs ({column_list}) "
                    f"SELECT {value_list} FROM generate_series(1, {size}) AS i"
                )
            with engine.begin() as connection:
                connection.execute(text(sql))
            done += size
    finally:
        engine.dispose()
    return time.perf_counter() - started


def count_jobs(database_url: str) -> int:
    """How many jobs the store holds."""
    with own_connection(database_url) as connection:
        return int(connection.execute(text("SELECT count(*) FROM handles_jobs")).scalar() or 0)
