"""Starting an HTTP node whose database may be briefly down: serve not-ready and retry in the background."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from handles.backoff import backoff_seconds
from handles.errors import ConfigurationError, DatabaseUnreachable, ShuttingDown
from handles.server.health import DATABASE_UNREACHABLE

if TYPE_CHECKING:
    from handles.app import Handles

logger = logging.getLogger("handles")


class BackgroundStart:
    """Starts the runtime of `handles` now, or keeps trying while the database does not answer."""

    def __init__(self, handles: Handles) -> None:
        self._handles = handles
        self._problem: str | None = None
        self._retrying: asyncio.Task[None] | None = None

    def problem(self) -> str | None:
        """Why the runtime has not started yet (None while it starts normally, or once it has)."""
        return self._problem

    async def begin(self) -> None:
        """Start now; when the database does not answer, go on retrying in the background."""
        try:
            await self._handles.start()
        except DatabaseUnreachable as exc:
            self._failed(1, exc)
            self._retrying = asyncio.create_task(self._retry(), name="handles-start-retry")

    async def cancel(self) -> None:
        if self._retrying is not None:
            self._retrying.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retrying

    def _failed(self, attempt: int, exc: DatabaseUnreachable) -> float:
        self._problem = DATABASE_UNREACHABLE
        delay = backoff_seconds(attempt)
        logger.warning("start-up attempt %d: %s Retrying in %.1fs.", attempt, exc, delay)
        return delay

    async def _retry(self) -> None:
        attempt, delay = 1, backoff_seconds(1)
        while not self._handles.runtime.closed:
            await asyncio.sleep(delay)
            attempt += 1
            try:
                await self._handles.start()
            except DatabaseUnreachable as exc:
                delay = self._failed(attempt, exc)
                continue
            except ShuttingDown:  # the node began to stop while the database was away
                return
            except ConfigurationError as exc:  # e.g. the schema turned out to be outdated: not transient
                self._problem = "misconfigured: " + str(exc)
                logger.error("the job runtime cannot start: %s", exc)
                return
            self._problem = None
            logger.info("the database answers (attempt %d); the job runtime has started", attempt)
            return
