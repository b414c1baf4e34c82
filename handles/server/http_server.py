"""The uvicorn server behind `handles.serve_http`: drain first, then stop (stopping sooner cuts SSE answers)."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import TYPE_CHECKING, Any

import uvicorn

if TYPE_CHECKING:
    from handles.app import Handles

logger = logging.getLogger("handles")

IN_FLIGHT_GRACE_SECONDS = 5.0
"""After the drain, how long answers still being written may take before uvicorn stops."""


def _not_session_end(record: logging.LogRecord) -> bool:
    """Drops the SDK's `Terminating session: None`, logged at INFO after every stateless request."""
    return not (record.levelno == logging.INFO and record.getMessage() == "Terminating session: None")


def quiet_stateless_sessions() -> None:
    """Keep the SDK's per-request session line out of the logs (idempotent)."""
    sdk = logging.getLogger("mcp.server.streamable_http")
    if _not_session_end not in sdk.filters:
        sdk.addFilter(_not_session_end)


class DrainingServer(uvicorn.Server):
    """A uvicorn server that drains `handles` before it stops listening, and says where it listens."""

    def __init__(self, config: uvicorn.Config, handles: Handles, *, health: str) -> None:
        super().__init__(config)
        self._handles = handles
        self._health = health
        self._loop = asyncio.get_running_loop()
        self._draining: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            logger.info(
                "serving MCP on http://%s:%d/mcp (health: %s)", self.config.host, self._port(), self._health
            )

    def _port(self) -> int:
        for server in getattr(self, "servers", []):
            for bound in server.sockets:
                return int(bound.getsockname()[1])
        return self.config.port

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self._draining is not None or self.should_exit:
            # A second signal: stop now. The jobs still running are handed over at once, not waited for.
            self._loop.call_soon_threadsafe(self._handles.end_drain)
            super().handle_exit(sig, frame)
            return
        self._loop.call_soon_threadsafe(self._begin_drain, sig, frame)

    def _begin_drain(self, sig: int, frame: Any) -> None:
        if self._draining is not None:
            return
        self._handles.begin_drain()
        self._draining = self._loop.create_task(self._drain_then_exit(sig, frame), name="handles-drain")

    async def _drain_then_exit(self, sig: int, frame: Any) -> None:
        try:
            await self._handles.drained()
            deadline = self._loop.time() + IN_FLIGHT_GRACE_SECONDS
            while self.server_state.tasks and self._loop.time() < deadline:
                await asyncio.sleep(0.05)
        finally:
            super().handle_exit(sig, frame)
