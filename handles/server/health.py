"""Liveness and readiness endpoints (`GET /healthz`, `GET /readyz`) of an HTTP node whose runtime starts in the
background while its database does not answer yet; probes share one database check in flight."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from handles.backoff import backoff_seconds
from handles.errors import ConfigurationError, DatabaseUnreachable, ShuttingDown

if TYPE_CHECKING:
    from handles.app import Handles

logger = logging.getLogger("handles")

STORE_CHECK_SECONDS = 1.0

STARTING = "starting"
DRAINING = "shutting down (draining)"
DATABASE_UNREACHABLE = "database unreachable"


class Readiness:
    """Whether this node should receive traffic now, and if not, why; it starts the runtime of `handles`
    (`begin`), retrying in the background while the database does not answer."""

    def __init__(self, handles: Handles) -> None:
        self._handles = handles
        self._problem: str | None = None
        """Why the runtime has not started yet (None while it starts normally, or once it has)."""
        self._retrying: asyncio.Task[None] | None = None
        self._check: asyncio.Task[bool] | None = None
        self._limiter = anyio.CapacityLimiter(1)

    async def begin(self) -> None:
        """Start now; when the database does not answer, go on retrying in the background."""
        try:
            await self._handles.start()
        except DatabaseUnreachable as exc:
            self._retrying = asyncio.create_task(
                self._retry(self._failed(1, exc)), name="handles-start-retry"
            )

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

    async def _retry(self, delay: float) -> None:
        attempt = 1
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

    async def reason(self) -> str | None:
        """None when ready, else the reason it is not."""
        runtime = self._handles.runtime
        if runtime.closed:
            return DRAINING
        if not runtime.started:
            return self._problem or STARTING
        if not await self._store_answers():
            return DATABASE_UNREACHABLE
        return None

    async def _store_answers(self) -> bool:
        if self._check is None or self._check.done():
            self._check = asyncio.create_task(self._ping(), name="handles-readiness")
        try:
            return await asyncio.wait_for(asyncio.shield(self._check), STORE_CHECK_SECONDS)
        except TimeoutError:
            return False

    async def _ping(self) -> bool:
        repository = self._handles.runtime.store.repo
        try:
            await anyio.to_thread.run_sync(repository.ping, limiter=self._limiter)
        except Exception:
            return False
        return True

    def routes(self, liveness_path: str | None, readiness_path: str | None) -> list[Route]:
        """The liveness and readiness routes (a path of None leaves that route out)."""

        async def alive(_request: Request) -> JSONResponse:
            return JSONResponse({"status": "ok"})

        async def ready(_request: Request) -> JSONResponse:
            reason = await self.reason()
            if reason is None:
                return JSONResponse({"status": "ready"})
            return JSONResponse({"status": "not_ready", "reason": reason}, status_code=503)

        routes = []
        if liveness_path is not None:
            routes.append(Route(liveness_path, alive, methods=["GET"]))
        if readiness_path is not None:
            routes.append(Route(readiness_path, ready, methods=["GET"]))
        return routes
