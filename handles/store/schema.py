"""Bringing the database's schema to what this version of handles needs, once per process (`SchemaGate`)."""

from __future__ import annotations

import asyncio
import threading

import anyio.to_thread

from handles.store import _retrieve
from handles.store.reach import database_errors
from handles.store.repository import JobRepository


class SchemaGate:
    """Opens once the schema is current; idempotent, and never waits for the database on the event loop."""

    def __init__(self, repository: JobRepository, *, auto_migrate: bool | None = None) -> None:
        """`auto_migrate` None: upgrade a database no other node uses (an SQLite file); only check a shared one."""
        self._repository = repository
        self._auto_migrate = (not repository.publishes) if auto_migrate is None else auto_migrate
        self._lock = threading.Lock()
        self.is_open = False
        self._attempt: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Upgrade or check the schema on a worker thread; a call during an attempt shares it."""
        if self.is_open:
            return
        loop = asyncio.get_running_loop()
        attempt = self._attempt
        if attempt is None or attempt.done() or attempt.get_loop() is not loop:
            attempt = self._attempt = loop.create_task(anyio.to_thread.run_sync(self._open_blocking))
            attempt.add_done_callback(_retrieve)
        # Shielded: a caller that goes away leaves the attempt to the others.
        await asyncio.shield(attempt)

    def _open_blocking(self) -> None:
        """Upgrade or check the schema (blocking); raises `ConfigurationError`/`DatabaseUnreachable`."""
        with self._lock:
            if self.is_open:
                return
            with database_errors(self._repository.url):
                self._repository.prepare(auto_migrate=self._auto_migrate)
            self.is_open = True
