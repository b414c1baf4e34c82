"""Bringing the database's schema to what this version of handles needs, once per process.

`SchemaGate.open()` runs before the runtime starts and before the first call that changes
a job: it upgrades the schema (when auto-migrate is on) or checks it is current. A database
that does not answer raises `DatabaseUnreachable` and the gate stays shut, so a later call
tries again; an outdated schema raises `ConfigurationError`.
"""

from __future__ import annotations

import threading

import anyio.to_thread

from handles.store.reach import database_errors
from handles.store.repository import JobRepository


class SchemaGate:
    """Opens once the schema is current; thread-safe and idempotent."""

    def __init__(self, repository: JobRepository, *, auto_migrate: bool) -> None:
        self._repository = repository
        self._auto_migrate = auto_migrate
        self._lock = threading.Lock()
        self._open = False

    @property
    def is_open(self) -> bool:
        return self._open

    def open(self) -> None:
        """Upgrade or check the schema (blocking); raises `ConfigurationError`/`DatabaseUnreachable`."""
        with self._lock:
            if self._open:
                return
            with database_errors(self._repository.url):
                self._repository.prepare(auto_migrate=self._auto_migrate)
            self._open = True

    async def aopen(self) -> None:
        """`open` on a worker thread, so the event loop keeps serving while the database answers."""
        if not self._open:
            await anyio.to_thread.run_sync(self.open)
