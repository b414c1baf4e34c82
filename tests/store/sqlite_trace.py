"""Which thread ran each statement of a kind on an SQLite file store: traced by SQLite itself, so
whether the statement went through SQLAlchemy's execution or straight to the DB-API connection."""

from __future__ import annotations

import sqlite3
import threading

from sqlalchemy import event

from handles.store import JobRepository


def statement_threads(repo: JobRepository, prefix: str) -> list[int]:
    """The threads that run each statement starting with `prefix`, on any connection of the repository's
    write engines opened from now on (the engines' pooled connections are closed first)."""
    threads: list[int] = []

    def seen(statement: str) -> None:
        if statement.startswith(prefix):
            threads.append(threading.get_ident())

    def traced(dbapi_connection: sqlite3.Connection, _record: object) -> None:
        dbapi_connection.set_trace_callback(seen)

    for engine in (repo._write_engine, repo._inline_write_engine):
        engine.dispose()  # every connection from here on is new, and traced from its connect
        event.listen(engine, "connect", traced)
    return threads
