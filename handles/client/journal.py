"""The client's journal: a small SQLite file mapping each unit of work to its job, written before waiting."""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, fields
from os import PathLike
from pathlib import Path
from typing import Any

from handles.client.outcomes import JournalConflict

_SCHEMA = """
create table if not exists handles_client_follows (
    key text primary key,
    server text not null,
    job text not null,
    arguments_digest text not null,
    idempotency_key text not null,
    created_via text not null,
    handle text,
    state text not null,
    outcome text,
    created_at real not null,
    updated_at real not null
)
"""


@dataclass(frozen=True)
class JournalEntry:
    """One unit of work the client follows; `state` is `starting`, `creating`, `unknown`, or the job's last seen status."""

    key: str
    server: str
    job: str
    arguments_digest: str
    idempotency_key: str
    created_via: str
    handle: str | None
    state: str
    outcome: dict[str, Any] | None
    created_at: float
    updated_at: float

    @property
    def ended(self) -> bool:
        return self.outcome is not None


_COLUMNS = ", ".join(field.name for field in fields(JournalEntry))
_SELECT = f"select {_COLUMNS} from handles_client_follows"


class Journal:
    """A small SQLite file mapping each key to its job; every write is committed before `follow` goes on."""

    def __init__(self, path: str | PathLike[str]) -> None:
        self.path = str(path)
        self._memory: sqlite3.Connection | None = None
        if self.path == ":memory:":
            self._memory = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        else:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        with self._connection() as db:
            db.execute(_SCHEMA)

    @contextlib.contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        if self._memory is not None:
            yield self._memory
            return
        with contextlib.closing(sqlite3.connect(self.path, timeout=30, isolation_level=None)) as db:
            db.execute("pragma synchronous = full")
            yield db

    def get(self, key: str) -> JournalEntry | None:
        with self._connection() as db:
            row = db.execute(f"{_SELECT} where key = ?", (key,)).fetchone()
        return None if row is None else _entry(row)

    def entries(self) -> list[JournalEntry]:
        with self._connection() as db:
            rows = db.execute(f"{_SELECT} order by created_at").fetchall()
        return [_entry(row) for row in rows]

    def forget(self, key: str) -> None:
        """Drop the key (the server's job, if any, is left alone)."""
        with self._connection() as db:
            db.execute("delete from handles_client_follows where key = ?", (key,))

    def reserve(
        self, key: str, *, server: str, job: str, arguments_digest: str, created_via: str, state: str
    ) -> tuple[JournalEntry, bool]:
        """The entry for `key` and whether this call created it (committed); raises `JournalConflict` when
        the key names another server, job or arguments."""
        now = time.time()
        with self._connection() as db:
            db.execute("begin immediate")
            with db:  # commits, or rolls back on an exception
                inserted = db.execute(
                    f"insert or ignore into handles_client_follows ({_COLUMNS}) "
                    "values (?, ?, ?, ?, ?, ?, null, ?, null, ?, ?)",
                    (key, server, job, arguments_digest, uuid.uuid4().hex, created_via, state, now, now),
                )
                row = db.execute(f"{_SELECT} where key = ?", (key,)).fetchone()
        entry = _entry(row)
        check_same_work(entry, server=server, job=job, arguments_digest=arguments_digest)
        return entry, inserted.rowcount == 1

    def set_handle(self, key: str, handle: str, state: str) -> None:
        self._update(key, "handle = ?, state = ?", (handle, state))

    def set_state(self, key: str, state: str) -> None:
        self._update(key, "state = ?", (state,))

    def finish(self, key: str, state: str, outcome: dict[str, Any]) -> None:
        self._update(key, "state = ?, outcome = ?", (state, json.dumps(outcome, default=str)))

    def _update(self, key: str, assignments: str, values: tuple[Any, ...]) -> None:
        with self._connection() as db:
            db.execute(
                f"update handles_client_follows set {assignments}, updated_at = ? where key = ?",
                (*values, time.time(), key),
            )


def check_same_work(entry: JournalEntry, *, server: str, job: str, arguments_digest: str) -> None:
    """Raise `JournalConflict` unless `entry` names this server, job and arguments."""
    mine = {"server": server, "job": job, "arguments": arguments_digest}
    theirs = {"server": entry.server, "job": entry.job, "arguments": entry.arguments_digest}
    differences = [name for name in mine if mine[name] != theirs[name]]
    if differences:
        raise JournalConflict(
            f"The key {entry.key!r} already names other work in the journal (different {', '.join(differences)}: "
            f"{entry.job} on {entry.server}). Use another key, or forget this one once it is no longer needed.",
            key=entry.key,
            handle=entry.handle,
        )


def _entry(row: tuple[Any, ...]) -> JournalEntry:
    values = list(row)
    values[8] = None if values[8] is None else json.loads(values[8])
    return JournalEntry(*values)


def arguments_digest(job: str, arguments: dict[str, Any]) -> str:
    canonical = json.dumps([job, arguments], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()
