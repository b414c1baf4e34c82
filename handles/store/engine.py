"""The database behind the store: its engines, connections and transactions (no queries here).

One `Database` per process and URL. On PostgreSQL, reads and writes have engines of their own
(reads in autocommit without a ping, writes pinged at checkout, a connect timeout). On SQLite, every
connection runs in WAL mode with synchronous=NORMAL (a commit survives a crash of the process), writes
begin with BEGIN IMMEDIATE behind one writer lock per process, and an SQLite file gets long-lived
connections for reads and short writes made on the event loop itself (`read_inline`, `write_inline`).

`JobRepository` (repository.py), its parts (claims.py, housekeeping.py, operator_reads.py, result_files.py,
switch_rows.py) and its engines' operations (sqlite.py, postgres.py) build on it: every query lives there.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import DBAPIError, StatementError
from sqlmodel import Session

from handles.errors import ConfigurationError
from handles.limits import stored_json
from handles.store.loop_connections import LoopConnections
from handles.store.notices import NoticeSender

P = ParamSpec("P")
T = TypeVar("T")
logger = logging.getLogger("handles.store")
_INLINE: ContextVar[bool] = ContextVar("handles_inline_read", default=False)
_INLINE_WRITE: ContextVar[bool] = ContextVar("handles_inline_write", default=False)
NOTICE: ContextVar[str | None] = ContextVar("handles_change_notice", default=None)
"""The change notice that write transactions in this context queue once they commit (`NoticeSender`; see
`JobRepository.publishing`)."""
NOTIFY_CHANNEL = "handles_jobs"
CONNECT_TIMEOUT_SECONDS = 10
"""How long a new PostgreSQL connection may take before the attempt fails (`connect_timeout`)."""
LOOP_CONNECTIONS = 8
"""How many PostgreSQL connections of one process's event loop its starts share (`LoopConnections`): as
many as the worker threads that ran them before (`Store`'s `threads`)."""
INLINE_COMMITS_PER_CHECKPOINT = 100
"""How many commits on the event loop's write connection (SQLite) a checkpoint follows. That connection
never checkpoints itself: SQLite's automatic checkpoint (past 1,000 WAL pages, about a hundred starts)
writes and syncs the database file in the committing connection, which on the event loop stalled every
request for several milliseconds. A passive checkpoint runs on a thread of its own instead."""


class WriterBusy(Exception):
    """An inline write found this process's writer lock taken: nothing was written."""


class WriterLock:
    """This process's SQLite writer lock (reentrant), which tells whoever asked (`wake_when_free`) when it
    is next released, from whichever thread releases it: a short write that found it taken on the event
    loop waits for it there and then writes there (why: `Store._write_later`)."""

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

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def wake_when_free(self, wake: Callable[[], None]) -> bool:
        """Call `wake` (on the releasing thread) once the lock is next released, and return True; return
        False, and never call it, when the lock is free now (or held by this very thread)."""
        with self._guard:
            if self._lock.acquire(blocking=False):
                self._lock.release()
                return False
            self._waiters.append(wake)
            return True


def as_sqlalchemy_error(engine: Engine, exc: Exception, *, disconnect: bool) -> StatementError:
    """The driver's error `exc` as SQLAlchemy's statement execution raises it (`OperationalError`,
    `IntegrityError`, ...), with `connection_invalidated` set when the server dropped the connection."""
    dialect = engine.dialect
    return DBAPIError.instance(
        None, None, exc, dialect.loaded_dbapi.Error, connection_invalidated=disconnect, dialect=dialect
    )


async def _connect_on_loop(engine: Engine) -> Any:
    """A psycopg `AsyncConnection` in autocommit, made with what `engine` connects with: the URL's
    parameters and the driver's settings as SQLAlchemy's dialect gives them (`create_connect_args`: its
    adapters, so JSON reads back as the engine reads it), and the connect timeout (`make_engines`)."""
    import psycopg

    cargs, cparams = engine.dialect.create_connect_args(engine.url)
    cparams.setdefault("connect_timeout", CONNECT_TIMEOUT_SECONDS)
    try:
        return await psycopg.AsyncConnection.connect(*cargs, autocommit=True, **cparams)
    except psycopg.Error as exc:
        raise as_sqlalchemy_error(engine, exc, disconnect=False) from exc


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def is_memory_sqlite(url: str) -> bool:
    path = url.split("?", 1)[0]
    return is_sqlite(url) and (path.endswith("://") or path.endswith(":memory:") or "mode=memory" in url)


def make_engines(url: str) -> tuple[Engine, Engine, Engine | None, Engine | None]:
    """(read engine, write engine, inline-read engine or None, inline-write engine or None).

    On PostgreSQL reads and writes have engines of their own (see below). On SQLite the
    write engine begins with BEGIN IMMEDIATE, and a file database gets a
    third engine for reads made on the event loop itself: in WAL mode a read never waits
    for a writer, so it costs less than the hop to a worker thread. Its
    connections give up after a brief wait on a lock instead of a long one (the caller then falls
    back to a worker thread). A fourth engine, for short writes made on the event loop, begins with
    BEGIN IMMEDIATE and never waits for SQLite's write lock (a busy timeout of 0): a writer at work
    in another process sends the write to a worker thread instead.
    """
    if not is_sqlite(url):
        # A database host that never answers (packets dropped, not refused) must not hang a start or a
        # request: libpq would wait forever without a connect timeout. One set in the URL wins.
        shared: dict[str, Any] = {"json_serializer": stored_json}
        if "connect_timeout" not in url:
            shared["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_SECONDS}
        write = create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10, **shared)
        # Reads in autocommit, without a ping at checkout: a poll is its statements and nothing else
        # (no BEGIN, no ROLLBACK, no ping). A read on a connection the server dropped fails at once
        # and invalidates the pool; `Store.read` retries it once on a fresh connection. Under READ
        # COMMITTED each statement took its own snapshot anyway, so no read loses consistency.
        read = create_engine(url, isolation_level="AUTOCOMMIT", pool_size=5, max_overflow=10, **shared)
        return read, write, None, None

    if is_memory_sqlite(url):
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


class Database:
    """The engines of one database and the transactions the repository's queries run in."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._read_engine, self._write_engine, self._inline_engine, self._inline_write_engine = make_engines(
            url
        )
        self._inline_connection: Connection | None = None
        self._inline_write_raw: Any = None  # the inline-write engine's DB-API connection (`_sqlite_writing`)
        self._inline_read_raw: Any = None  # the inline-read engine's DB-API connection (`_sqlite_reading`)
        self._inline_lock = threading.Lock()
        # PostgreSQL: a start's one statement, awaited on the event loop (`JobRepository.start_on_loop`).
        self.loop_connections: LoopConnections | None = (
            None
            if is_sqlite(url)
            else LoopConnections(functools.partial(_connect_on_loop, self._read_engine), LOOP_CONNECTIONS)
        )
        # PostgreSQL: the change notices of committed writes, sent together (notices.py).
        self.notices = None if is_sqlite(url) else NoticeSender(self._send_notices)
        self._notifying: Any = None  # the connection they go out on
        self._inline_commits = 0  # since the last checkpoint (see INLINE_COMMITS_PER_CHECKPOINT)
        self._checkpointer: threading.Thread | None = None
        # SQLite has one writer at a time. Queue this process's writers on a lock rather than in
        # SQLite's busy handler, which sleeps in coarse steps while the lock is held.
        self._write_lock: WriterLock | contextlib.nullcontext[None] = (
            WriterLock() if is_sqlite(url) else contextlib.nullcontext()
        )

    @property
    def dialect(self) -> str:
        return self._write_engine.dialect.name

    @property
    def engine(self) -> Engine:
        """The engine writes go through (migrations, bulk maintenance)."""
        return self._write_engine

    def create_schema(self) -> None:
        """Create or upgrade the handles tables to the newest schema revision (Alembic migrations)."""
        from handles.store import migrate

        migrate.upgrade(self.engine)

    def prepare(self, *, auto_migrate: bool) -> None:
        """Make sure the schema is current: upgrade it, or refuse to go on when upgrades are the operator's."""
        from handles.store import migrate

        if auto_migrate:
            migrate.upgrade(self._write_engine)
        else:
            migrate.check_current(self._write_engine)

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
        if self._inline_connection is not None:
            self._inline_connection.close()
            self._inline_connection = None
        if self._inline_write_raw is not None:
            self._inline_write_raw.close()
            self._inline_write_raw = None
        if self._inline_read_raw is not None:
            self._inline_read_raw.close()
            self._inline_read_raw = None
        if self._inline_write_engine is not None:
            self._inline_write_engine.dispose()
        self._read_engine.dispose()
        if self._inline_engine is not None:
            self._inline_engine.dispose()
        if self._write_engine is not self._read_engine:
            self._write_engine.dispose()

    @property
    def reads_inline(self) -> bool:
        """Whether reads may run on the calling (event loop) thread: SQLite files only."""
        return self._inline_engine is not None

    def read_inline(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run the read method `fn` here, on connections that fail fast instead of waiting on a lock."""
        token = _INLINE.set(True)
        try:
            return fn(*args, **kwargs)
        finally:
            _INLINE.reset(token)

    @property
    def writes_inline(self) -> bool:
        """Whether short writes may be tried on the calling (event loop) thread: SQLite files only."""
        return self._inline_write_engine is not None

    def write_inline(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run the short write method `fn` here, if it can have the writer lock without waiting.

        Raises `WriterBusy` (nothing written) when this process's writer lock is held: the caller may wait
        for it on the event loop (`wake_when_writer_free`) and try again. Raises SQLite's "database is
        locked" (`OperationalError`, nothing written) when another process writes: the caller then runs
        `fn` on a worker thread, whose connection waits for SQLite's lock. Its reads, too, are the inline
        reads that fail fast.
        """
        tokens = (_INLINE_WRITE.set(True), _INLINE.set(True))
        try:
            return fn(*args, **kwargs)
        finally:
            _INLINE.reset(tokens[1])
            _INLINE_WRITE.reset(tokens[0])

    def wake_when_writer_free(self, wake: Callable[[], None]) -> bool:
        """Call `wake` once this process's writer lock is next released (True), or return False at once when
        it is free (or the store has no such lock): for an inline write that met `WriterBusy`."""
        lock = self._write_lock
        return isinstance(lock, WriterLock) and lock.wake_when_free(wake)

    def checkpoint(self) -> None:
        """Copy the WAL's committed pages into an SQLite file, behind this process's writer lock (a passive
        checkpoint: it waits for no reader, and copies what no reader still needs). With this process's
        writers held meanwhile (an inline start that meets the lock goes to a worker thread), the WAL is
        wholly copied when it ends, so the next writer starts it over; a checkpoint made beside a stream
        of starts would never let it start over, and it would grow by every page they write. Nothing to
        do elsewhere."""
        if self._inline_write_engine is None:
            return
        with self._write_lock:
            pooled = self._write_engine.raw_connection()
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
        """Count a commit of the event loop's write connection; every INLINE_COMMITS_PER_CHECKPOINT of them,
        start a checkpoint on a thread of its own (one at a time; a busy one lets the count run on)."""
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
        except RuntimeError as exc:  # no thread to be had now: the next hundred commits try again
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
        """A write transaction (`BEGIN IMMEDIATE` ... `COMMIT`) on SQLite's own DB-API connection, past
        SQLAlchemy's session and statement execution, for the hottest writes (a start's insert, a job's
        outcome).

        The connection is configured as every other (WAL, synchronous=NORMAL, foreign keys). On the
        event loop (`write_inline`) it is the long-lived inline-write connection, with this process's
        writer lock taken without waiting and SQLite's lock too (busy timeout 0): `WriterBusy` or
        `OperationalError` when either is held, and nothing was written. Elsewhere a pooled connection of
        the write engine, behind the writer lock as every write. A database error leaves the
        transaction rolled back and comes out as SQLAlchemy's exception (`OperationalError`,
        `IntegrityError`, ...), as from any other method.
        """
        inline = _INLINE_WRITE.get() and self._inline_write_engine is not None
        lock = self._write_lock
        if inline:
            if isinstance(lock, WriterLock) and not lock.acquire(blocking=False):
                raise WriterBusy
        else:
            lock.__enter__()
        pooled: Any = None
        try:
            if inline:
                assert self._inline_write_engine is not None
                if self._inline_write_raw is None:
                    self._inline_write_raw = self._inline_write_engine.raw_connection()
                pooled = self._inline_write_raw
            else:
                pooled = self._write_engine.raw_connection()
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
            if not inline or isinstance(lock, WriterLock):
                lock.__exit__(None, None, None)

    @contextmanager
    def _sqlite_reading(self) -> Iterator[sqlite3.Connection | None]:
        """SQLite's own long-lived connection of the inline-read engine, for a hot read made on the event
        loop (`read_inline`) past SQLAlchemy's statement execution; None elsewhere (read through
        SQLAlchemy then). In autocommit, as the inline reads through SQLAlchemy: each statement is its
        own snapshot, ended when its rows are all fetched. A database error comes out as SQLAlchemy's
        exception (`OperationalError` for a lock, which sends the read to a worker thread)."""
        if not (_INLINE.get() and self._inline_engine is not None):
            yield None
            return
        with self._inline_lock:
            if self._inline_read_raw is None:
                self._inline_read_raw = self._inline_engine.raw_connection()
            pooled = self._inline_read_raw
            try:
                yield pooled.driver_connection
            except BaseException as exc:
                pooled.invalidate()  # a fresh connection next time, in a known state
                self._inline_read_raw = None
                if isinstance(exc, sqlite3.Error):
                    raise DBAPIError.instance(None, None, exc, sqlite3.Error) from exc
                raise

    @contextmanager
    def _reading(self) -> Iterator[Session]:
        with Session(self._read_engine, expire_on_commit=False) as session:
            yield session

    @contextmanager
    def _fast_reading(self) -> Iterator[Connection]:
        """A connection for the hot reads (by key), which skip the ORM session.

        Inline (on the event loop, SQLite file): one long-lived connection, its read
        transaction ended after each use so the next read sees the newest commit.
        Otherwise a pooled connection of the read engine.
        """
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
        # Waits for the writer lock, so never on the event loop: what `write_inline` runs writes on
        # SQLite's own connection (`_sqlite_writing`), which refuses instead of waiting.
        assert not _INLINE_WRITE.get(), "an inline write takes the ORM's path"
        with (
            self._write_lock,
            Session(self._write_engine, expire_on_commit=False) as session,
            session.begin(),
        ):
            yield session
        self.committed(NOTICE.get())

    def committed(self, notice: str | None) -> None:
        """A write that changed a job has committed: queue its change notice, if it has one."""
        if notice is not None and self.notices is not None:
            self.notices.add(notice)

    def _send_notices(self, notices: list[str]) -> None:
        """Send `notices` in one transaction of their own, one `pg_notify` each, on a connection kept for them
        (`NoticeSender`'s thread alone uses it); one that fails is closed, and the next batch opens another."""
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
