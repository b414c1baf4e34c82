"""What `JobRepository` runs differently on SQLite and PostgreSQL (`EngineOps`, implemented by `SqliteOps` and
`PostgresOps`), and what those operations use of the repository (`EngineHost`). The hot paths and what only
one engine has (a server clock, row locks, change notices, starts awaited on the event loop) live there;
everything else is engine-neutral."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any, Literal, ParamSpec, Protocol, TypeVar

from sqlalchemy import Connection, Engine
from sqlmodel import Session

from handles.states import Status
from handles.store.loop_connections import LoopConnections
from handles.store.models import Clock, InputRequestRecord, JobRecord, Snapshot, StepRecord
from handles.store.sqlite_direct import _Prepared

P = ParamSpec("P")
T = TypeVar("T")

Change = Literal["changed", "queued", "reported"]
"""What a write did to a job, as its notice says: `changed` (anything, status included), `queued` (it now
waits for a worker), `reported` (only a progress report or a durable step's start or outcome)."""


class EngineHost(Protocol):
    """What an engine's operations use of the `JobRepository` that holds them."""

    loop_connections: LoopConnections | None
    _read_engine: Engine
    _database_leases: bool

    @property
    def engine(self) -> Engine: ...

    def _prepare(self, statement: Any) -> _Prepared: ...

    def _sqlite_writing(self) -> AbstractContextManager[sqlite3.Connection]: ...

    def _sqlite_reading(self) -> AbstractContextManager[sqlite3.Connection | None]: ...

    def _fast_reading(self) -> AbstractContextManager[Connection]: ...

    def _writing(self) -> AbstractContextManager[Session]: ...

    def _by_database_clock(self, values: Mapping[str, Any]) -> Mapping[str, Any]: ...

    def get(self, job_id: str) -> JobRecord | None: ...

    def notice(self, job_id: str, origin: str, change: Change) -> str: ...

    def committed(self, notice: str | None) -> None: ...


class EngineOps(Protocol):
    """The engine's way of doing the `JobRepository` method of the same name, given the values the repository
    worked out."""

    has_clock: bool
    """Whether the database server has a clock of its own that may judge leases."""
    locks_rows: bool
    """Whether a write transaction locks the rows it reads (`FOR UPDATE`)."""
    publishes: bool
    """Whether changes are told to other nodes by notices."""

    @property
    def starts_on_loop(self) -> bool: ...

    def hot_reading(self) -> AbstractContextManager[Any]: ...

    def skip_locked(self, query: Any) -> Any: ...

    def clock_offset(self, clock: Clock) -> timedelta: ...

    def snapshot(self, job_id: str) -> Snapshot: ...

    def insert(
        self,
        values: dict[str, Any],
        active_limit: int | None,
        questions: Sequence[InputRequestRecord],
        lease_seconds: float | None,
    ) -> tuple[JobRecord, bool]: ...

    async def start_on_loop(
        self,
        values: dict[str, Any],
        notice: str | None,
        active_limit: int | None,
        questions: Sequence[InputRequestRecord],
        lease_seconds: float | None,
    ) -> tuple[JobRecord, bool]: ...

    def publish(self, job_id: str, origin: str, change: Change) -> None: ...

    def load_notice_scope(self) -> str | None: ...

    def publishing(
        self, job_id: str, origin: str, change: Change, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs
    ) -> T: ...

    def set_progress(self, values: Mapping[str, Any]) -> bool: ...

    def transition(
        self,
        job_id: str,
        target: Status,
        owner: str | None,
        lease_expired: bool,
        now: datetime,
        values: Mapping[str, Any],
    ) -> bool: ...

    def begin_step(
        self,
        values: dict[str, Any],
        repeatable: bool,
        owner: str,
        now: datetime,
        own: tuple[int, datetime] | None,
    ) -> tuple[StepRecord, bool]: ...

    def finish_step(self, values: Mapping[str, Any]) -> None: ...
