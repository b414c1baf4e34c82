"""Helpers of the store tests on an SQLite file: which thread ran a kind of statement (traced by SQLite
itself, so whether it went through SQLAlchemy's execution or straight to the DB-API connection), and a
writer of another process, or another write of this one, holding SQLite's write lock while the event loop goes
on serving."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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

    for engine in (repo.engine, repo._inline_write_engine):
        engine.dispose()  # every connection from here on is new, and traced from its connect
        event.listen(engine, "connect", traced)
    return threads


@contextmanager
def another_process_writing(path: Path) -> Iterator[sqlite3.Connection]:
    """SQLite's write lock on `path` held, as by another process's writer, until the caller runs `COMMIT`
    on the connection it gets."""
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield other
    finally:
        other.close()


@contextmanager
def this_process_writing(repo: JobRepository) -> Iterator[threading.Event]:
    """This process's writer lock, and SQLite's, held by a write of `repo` on a thread of its own (as a sweep
    or a heartbeat holds them) until the caller sets the event it gets, or the block ends."""
    held, release = threading.Event(), threading.Event()

    def writer() -> None:
        with repo._writing():
            held.set()
            release.wait(10)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert held.wait(5), "the writer never took the lock"
        yield release
    finally:
        release.set()
        thread.join(5)


async def ticks_while_pending(pending: asyncio.Future[Any], wanted: int = 10, seconds: float = 5.0) -> int:
    """How many 10 ms sleeps the event loop served, up to `wanted` (or as many as `seconds` allowed: a loaded
    host serves them slower than one each 10 ms), checking that `pending` still waits after them. A loop
    blocked by `pending` serves none before it is done."""
    ticks = 0
    began = time.monotonic()
    while ticks < wanted and time.monotonic() - began < seconds:
        await asyncio.sleep(0.01)
        ticks += 1
    assert not pending.done()
    return ticks
