"""Liveness and readiness endpoints (`GET /healthz`, `GET /readyz`); probes share one database check in flight."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

if TYPE_CHECKING:
    from handles.app import Handles

STORE_CHECK_SECONDS = 1.0

STARTING = "starting"
DRAINING = "shutting down (draining)"
DATABASE_UNREACHABLE = "database unreachable"


class Readiness:
    """Whether this node should receive traffic now, and if not, why."""

    def __init__(self, handles: Handles, startup_problem: Callable[[], str | None]) -> None:
        self._handles = handles
        self._startup_problem = startup_problem
        self._check: asyncio.Task[bool] | None = None
        self._limiter = anyio.CapacityLimiter(1)

    async def reason(self) -> str | None:
        """None when ready, else the reason it is not."""
        runtime = self._handles.runtime
        if runtime.closed:
            return DRAINING
        if not runtime.started:
            return self._startup_problem() or STARTING
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


def health_routes(
    handles: Handles,
    liveness_path: str | None,
    readiness_path: str | None,
    startup_problem: Callable[[], str | None],
) -> list[Route]:
    """The liveness and readiness routes (a path of None leaves that route out)."""
    readiness = Readiness(handles, startup_problem)

    async def alive(_request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def ready(_request: Request) -> JSONResponse:
        reason = await readiness.reason()
        if reason is None:
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "not_ready", "reason": reason}, status_code=503)

    routes = []
    if liveness_path is not None:
        routes.append(Route(liveness_path, alive, methods=["GET"]))
    if readiness_path is not None:
        routes.append(Route(readiness_path, ready, methods=["GET"]))
    return routes
