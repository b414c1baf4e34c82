"""The database behind the store: its engines, connections and transactions (no queries here)."""

from __future__ import annotations

import contextlib
import functools
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import Any, Literal, ParamSpec, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event, func
from sqlalchemy import select as sa_select
from sqlalchemy.exc import DBAPIError, StatementError
from sqlmodel import Session

from handles.errors import ConfigurationError
from handles.limits import stored_json
from handles.store.loop_connections import LoopConnections
from handles.store.models import Clock, utc_now
from handles.store.notices import NoticeSender
from handles.store.sqlite_direct import _Prepared
from handles.store.statements import _DATABASE_NOW

P = ParamSpec("P")
T = TypeVar("T")
logger = logging.getLogger("handles.store")
_INLINE: ContextVar[bool] = ContextVar("handles_inline_read", default=False)
_INLINE_WRITE: ContextVar[bool] = ContextVar("handles_inline_write", default=False)
Change = Literal["changed", "queued", "reported"]
"""What a write did to a job, as its notice says: `changed` (anything, status included), `queued` (it now
waits for a worker), `reported` (only a progress report or a durable step's start or outcome)."""
NOTICE: ContextVar[str | None] = ContextVar("handles_change_notice", default=None)
"""The change notice that write transactions in this context queue once they commit."""
NOTIFY_CHANNEL = "handles_jobs"
CONNECT_TIMEOUT_SECONDS = 10  # how long a new PostgreSQL connection may take before the attempt fails
LOOP_CONNECTIONS = 8  # how many PostgreSQL connections one process's event loop shares for its starts
INLINE_COMMITS_PER_CHECKPOINT = 100
"""How many commits on the event loop's SQLite write connection a checkpoint on a thread of its own follows;
that connection never checkpoints itself, which would sync the file on the event loop."""
# A new job's deadlines, moved to the database's clock at a start (`_by_database_clock`).
_START_DEADLINES = ("run_after", "expires_at", "abandon_at", "input_deadline")


class WriterBusy(Exception):
    """An inline write found this process's writer lock taken: nothing was written."""


class WriterLock:
    """This process's reentrant SQLite writer lock, which can wake a waiter when it is released."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._guard = threading.Lock()  # the waiters, and the release that wakes them, one at a time
        self._waiters: list[Callable[[], None]] = []

    def acquire(self, blocking: bool = True) -> bool:
        return self._lock.acquire(blocking)

    def release(self) -> None:
        with self._guard:
            self._lock.release()
            waiters, self._waiters = self._waiters, []
        for wake in waiters:
            wake()

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self.release()

    def wake_when_free(self, wake: Callable[[], None]) -> bool:
        """Call `wake` on the lock's next release and return True; False when the lock is free now."""
        with self._guard:
            if self._lock.acquire(blocking=False):
                self._lock.release()
                return False
            self._waiters.append(wake)
            return True


def as_sqlalchemy_error(engine: Engine, exc: Exception, *, disconnect: bool) -> StatementError:
    """The driver's error `exc` as SQLAlchemy raises it (`connection_invalidated` on a drop)."""
    dialect = engine.dialect
    return DBAPIError.instance(
        None, None, exc, dialect.loaded_dbapi.Error, connection_invalidated=disconnect, dialect=dialect
    )


async def _connect_on_loop(engine: Engine) -> Any:
    """A psycopg `AsyncConnection` in autocommit, connected as `engine` connects."""
    import psycopg

    cargs, cparams = engine.dialect.create_connect_args(engine.url)
    cparams.setdefault("connect_timeout", CONNECT_TIMEOUT_SECONDS)
    try:
        return await psycopg.AsyncConnection.connect(*cargs, autocommit=True, **cparams)
    except psycopg.Error as exc:
        raise as_sqlalchemy_error(engine, exc, disconnect=False) from exc


def _postgres_engines(url: str) -> tuple[Engine, Engine]:
    """(read, write) engines of a PostgreSQL database."""
    # libpq waits forever for a host that drops packets; one set in the URL wins.
    shared: dict[str, Any] = {"json_serializer": stored_json}
    if "connect_timeout" not in url:
        shared["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_SECONDS}
    write = create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10, **shared)
    # Autocommit, no ping: a read on a dropped connection fails at once; `Store.read` retries it.
    read = create_engine(url, isolation_level="AUTOCOMMIT", pool_size=5, max_overflow=10, **shared)
    return read, write


def _sqlite_engines(url: str) -> tuple[Engine, Engine, Engine, Engine]:
    """(read, write, inline-read, inline-write) engines of an SQLite file."""
    path = url.split("?", 1)[0]
    if path.endswith("://") or path.endswith(":memory:") or "mode=memory" in url:
        raise ConfigurationError(
            f"HANDLES_DATABASE_URL={url!r} is an in-memory SQLite database, which cannot be shared by the "
            "threads that serve requests and run jobs, and loses every job when the process ends. Use an "
            "SQLite file (sqlite:///path/to/handles.db, the default under HANDLES_DATA_DIR) or PostgreSQL."
        )
    kwargs: dict[str, Any] = {
        "connect_args": {"check_same_thread": False, "timeout": 30},
        "json_serializer": stored_json,
    }

    def configure(
        engine: Engine, begin: str | None, busy_ms: int = 30000, *, checkpoints: bool = True
    ) -> Engine:
        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            # Take transaction control away from pysqlite so BEGIN is ours to issue.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute(f"PRAGMA busy_timeout={busy_ms}")
            cursor.execute("PRAGMA foreign_keys=ON")
            if not checkpoints:
                cursor.execute("PRAGMA wal_autocheckpoint=0")  # see INLINE_COMMITS_PER_CHECKPOINT
            cursor.close()

        if begin is not None:

            @event.listens_for(engine, "begin")
            def _on_begin(connection: Any) -> None:
                connection.exec_driver_sql(begin)

        return engine

    write = configure(create_engine(url, **kwargs), "BEGIN IMMEDIATE")
    read = configure(create_engine(url, **kwargs), "BEGIN")
    # No BEGIN: each read statement is its own snapshot, with nothing to end afterwards.
    inline = configure(create_engine(url, **kwargs), None, busy_ms=50)
    inline_write = configure(create_engine(url, **kwargs), "BEGIN IMMEDIATE", busy_ms=0, checkpoints=False)
    return read, write, inline, inline_write


def _leases_by_database(lease_clock: str | None, *, server_clock: bool, test_clock: bool) -> bool:
    """Whether leases go by the database server's clock: `lease_clock`, by default where there is one."""
    if lease_clock is None:
        lease_clock = "database" if server_clock and not test_clock else "local"
    if lease_clock not in ("database", "local"):
        raise ValueError("lease_clock must be 'database' or 'local'")
    if lease_clock == "database" and not server_clock:
        raise ValueError(
            "lease_clock='database' needs a database server with a clock of its own (PostgreSQL); "
            "SQLite runs in this process, so its leases are judged by `clock`: use 'local'"
        )
    return lease_clock == "database"


class Database:
    """The engines of one database, the clock that judges its leases, and the transactions the repository's
    queries run in."""

    engine: Engine
    """The engine writes go through (migrations, bulk maintenance)."""

    def __init__(self, url: str, *, clock: Clock = utc_now, lease_clock: str | None = None) -> None:
        """`clock` and `lease_clock` as `JobRepository` takes them."""
        self.url = url
        self.clock = clock
        self._inline_engine: Engine | None = None
        self._inline_write_engine: Engine | None = None
        self._inline_connection: Connection | None = None
        self._inline_write_raw: Any = None  # the inline-write engine's DB-API connection (`_sqlite_writing`)
        self._inline_lock = threading.Lock()
        self._notifying: Any = None  # the connection notices go out on
        self._inline_commits = 0  # since the last checkpoint (see INLINE_COMMITS_PER_CHECKPOINT)
        self._checkpointer: threading.Thread | None = None
        self.loop_connections: LoopConnections | None = None
        self.notices: NoticeSender | None = None
        self._prepared: dict[Any, _Prepared] = {}  # the hot paths' statements, compiled (`_prepare`)
        self._clock_offset = timedelta(0)  # how far the database's clock is ahead of this node's
        self._write_lock: WriterLock | contextlib.nullcontext[None] = contextlib.nullcontext()
        # Else PostgreSQL. `JobRepository` picks its ops by it, and `Store.of` its store (`SqliteStore` tries
        # reads, and short writes, on the calling event loop thread).
        self.sqlite = url.startswith("sqlite")
        if self.sqlite:
            engines = _sqlite_engines(url)
            self._read_engine, self.engine, self._inline_engine, self._inline_write_engine = engines
            # Queue writers on a lock, not in SQLite's busy handler, which sleeps in coarse steps.
            self._write_lock = WriterLock()
        else:
            self._read_engine, self.engine = _postgres_engines(url)
            self.loop_connections = LoopConnections(
                functools.partial(_connect_on_loop, self._read_engine), LOOP_CONNECTIONS
            )
            self.notices = NoticeSender(self._send_notices)
        # SQLite runs in this process; a PostgreSQL server's clock lets nodes with skewed clocks agree on leases.
        self.database_leases = _leases_by_database(
            lease_clock, server_clock=not self.sqlite, test_clock=clock is not utc_now
        )

    def _lease_now(self, now: datetime) -> Any:
        """`now` for lease arithmetic in SQL: the database's own clock, or the local one."""
        return func.now() if self.database_leases else now

    def _lease_now_value(self, session: Session, now: datetime) -> datetime:
        """`now` for lease comparisons made in Python, inside a write transaction."""
        if not self.database_leases:
            return now
        value: datetime = session.execute(sa_select(_DATABASE_NOW)).scalar_one()
        return value

    def read_database_clock(self) -> timedelta:
        """Measure and keep how far the database's clock is ahead of `clock`."""
        if not self.database_leases:
            return timedelta(0)
        with self._read_engine.connect() as connection:  # checked out before the first reading
            before = self.clock()
            database_now = connection.exec_driver_sql("SELECT clock_timestamp()").scalar_one()
            after = self.clock()
        self._clock_offset = database_now - (before + (after - before) / 2)
        return self._clock_offset

    @property
    def publishes(self) -> bool:
        """Whether this store tells other nodes of its changes by notices (PostgreSQL's `pg_notify`)."""
        return self.notices is not None

    def _prepare(self, statement: Any) -> _Prepared:
        prepared = self._prepared.get(statement)
        if prepared is None:
            prepared = self._prepared[statement] = _Prepared(statement, self.engine.dialect)
        return prepared

    def _by_database_clock(self, values: Mapping[str, Any]) -> Mapping[str, Any]:
        """A new job's row `values` with its deadlines moved from this node's clock to the database's."""
        offset = self._clock_offset
        if not offset:
            return values
        moved = {name: values[name] + offset for name in _START_DEADLINES if values[name] is not None}
        return {**values, **moved}

    def prepare(self, *, auto_migrate: bool) -> None:
        """Make sure the schema is current: upgrade it to the newest revision (Alembic migrations), or refuse to
        go on when upgrades are the operator's."""
        from handles.store import migrate

        (migrate.upgrade if auto_migrate else migrate.check_current)(self.engine)

    def ping(self) -> None:
        """A trivial query: raises when the database does not answer (the readiness probe)."""
        with self._read_engine.connect() as connection:
            connection.exec_driver_sql("select 1")

    def dispose(self) -> None:
        self.wait_for_checkpoint(30)
        if self.notices is not None:
            self.notices.close()
            self._close_notifying()
        if self.loop_connections is not None:
            self.loop_connections.close()
        for connection in (self._inline_connection, self._inline_write_raw):
            if connection is not None:
                connection.close()
        self._inline_connection = self._inline_write_raw = None
        for engine in (self._inline_write_engine, self._read_engine, self._inline_engine, self.engine):
            if engine is not None:
                engine.dispose()

    def read_inline(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run the read method `fn` here, on connections that fail fast instead of waiting on a lock."""
        token = _INLINE.set(True)
        try:
            return fn(*args, **kwargs)
        finally:
            _INLINE.reset(token)

    def write_inline(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run the short write `fn` here if the writer lock is free, else raise with nothing written."""
        tokens = (_INLINE_WRITE.set(True), _INLINE.set(True))
        try:
            return fn(*args, **kwargs)
        finally:
            _INLINE.reset(tokens[1])
            _INLINE_WRITE.reset(tokens[0])

    def wake_when_writer_free(self, wake: Callable[[], None]) -> bool:
        """Call `wake` on the writer lock's next release (True); False when it is free or absent."""
        lock = self._write_lock
        return isinstance(lock, WriterLock) and lock.wake_when_free(wake)

    def checkpoint(self) -> None:
        """A passive WAL checkpoint of an SQLite file behind the writer lock; nothing elsewhere."""
        if self._inline_write_engine is None:
            return
        with self._write_lock:
            pooled = self.engine.raw_connection()
            try:
                connection: Any = pooled.driver_connection
                connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            finally:
                pooled.close()

    def wait_for_checkpoint(self, timeout: float) -> None:
        """Return once the checkpoint under way (if any) has ended, or after `timeout` seconds."""
        checkpointer = self._checkpointer
        if checkpointer is not None:
            checkpointer.join(timeout)

    def _after_inline_commit(self) -> None:
        """Count an inline commit, starting a checkpoint thread every `INLINE_COMMITS_PER_CHECKPOINT`."""
        self._inline_commits += 1
        if self._inline_commits < INLINE_COMMITS_PER_CHECKPOINT:
            return
        if self._checkpointer is not None and self._checkpointer.is_alive():
            return
        self._inline_commits = 0
        checkpointer = threading.Thread(
            target=self._checkpoint_quietly, name="handles-sqlite-checkpoint", daemon=True
        )
        try:
            checkpointer.start()
        except RuntimeError as exc:  # no thread to be had now: later commits try again
            logger.warning("could not start an SQLite checkpoint: %s", exc)
            return
        self._checkpointer = checkpointer

    def _checkpoint_quietly(self) -> None:
        try:
            self.checkpoint()
        except Exception as exc:  # the next one tries again; SQLite's data is safe in the WAL meanwhile
            logger.warning("SQLite checkpoint failed: %s", exc)

    @contextmanager
    def _sqlite_writing(self) -> Iterator[sqlite3.Connection]:
        """A `BEGIN IMMEDIATE` transaction on SQLite's own connection for the hottest writes, inline without
        waiting; a database error rolls back and comes out as SQLAlchemy's."""
        inline = _INLINE_WRITE.get()
        lock, engine = self._write_lock, self._inline_write_engine
        assert isinstance(lock, WriterLock) and engine is not None  # an SQLite file's
        if not lock.acquire(blocking=not inline):
            raise WriterBusy
        pooled: Any = None
        try:
            if not inline:
                pooled = self.engine.raw_connection()
            elif self._inline_write_raw is None:
                pooled = self._inline_write_raw = engine.raw_connection()
            else:
                pooled = self._inline_write_raw
            connection: sqlite3.Connection = pooled.driver_connection
            statement: str | None = "BEGIN IMMEDIATE"
            try:
                connection.execute("BEGIN IMMEDIATE")
                statement = None  # the caller's own statements
                yield connection
                connection.execute("COMMIT")
                if inline:
                    self._after_inline_commit()
            except BaseException as exc:
                if connection.in_transaction:
                    try:
                        connection.execute("ROLLBACK")
                    except sqlite3.Error:
                        pooled.invalidate()  # a fresh connection next time, in a known state
                        if inline:
                            self._inline_write_raw = None
                if isinstance(exc, sqlite3.Error):
                    raise DBAPIError.instance(statement, None, exc, sqlite3.Error) from exc
                raise
        finally:
            if not inline and pooled is not None:
                pooled.close()  # back to the pool
            lock.release()

    @contextmanager
    def _sqlite_reading(self) -> Iterator[sqlite3.Connection | None]:
        """SQLite's own inline connection for a hot read on the event loop; None elsewhere."""
        if not (_INLINE.get() and self._inline_engine is not None):
            yield None
            return
        with self._fast_reading() as connection:
            try:
                yield connection.connection.driver_connection
            except sqlite3.Error as exc:
                raise DBAPIError.instance(None, None, exc, sqlite3.Error) from exc

    @contextmanager
    def _reading(self) -> Iterator[Session]:
        with Session(self._read_engine, expire_on_commit=False) as session:
            yield session

    @contextmanager
    def _fast_reading(self) -> Iterator[Connection]:
        """A Core connection for the hot reads: the long-lived inline one, or a pooled one."""
        if not (_INLINE.get() and self._inline_engine is not None):
            with self._read_engine.connect() as connection:
                yield connection
            return
        with self._inline_lock:
            if self._inline_connection is None or self._inline_connection.closed:
                self._inline_connection = self._inline_engine.connect()
            connection = self._inline_connection
            try:
                yield connection
            except BaseException:
                connection.invalidate()
                self._inline_connection = None
                raise
            else:
                connection.rollback()

    @contextmanager
    def _writing(self) -> Iterator[Session]:
        # Waits for the writer lock, so never on the event loop.
        assert not _INLINE_WRITE.get(), "an inline write takes the ORM's path"
        with (
            self._write_lock,
            Session(self.engine, expire_on_commit=False) as session,
            session.begin(),
        ):
            yield session
        self.committed(NOTICE.get())

    def committed(self, notice: str | None) -> None:
        """A write that changed a job has committed: queue its change notice, if it has one."""
        if notice is not None and self.notices is not None:
            self.notices.add(notice)

    def _send_notices(self, notices: list[str]) -> None:
        """Send `notices` in one transaction on a connection kept for `NoticeSender`'s thread."""
        import psycopg

        try:
            if self._notifying is None:
                cargs, cparams = self._read_engine.dialect.create_connect_args(self._read_engine.url)
                cparams.setdefault("connect_timeout", CONNECT_TIMEOUT_SECONDS)
                self._notifying = psycopg.connect(*cargs, autocommit=True, **cparams)
                # A notice is a wake-up, not data: its commit need not wait for (and hold the lock through) a flush.
                self._notifying.execute("SET synchronous_commit = off")
            sql = "SELECT count(pg_notify(%s, n)) FROM unnest(%s::text[]) AS n"
            self._notifying.execute(sql, (NOTIFY_CHANNEL, notices))
        except psycopg.Error:
            self._close_notifying()
            raise

    def _close_notifying(self) -> None:
        if self._notifying is not None:
            self._notifying.close()
            self._notifying = None
