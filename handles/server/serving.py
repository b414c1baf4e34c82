"""Serving a bound server with its job runtime: stdio, the Streamable HTTP app, and `serve_http` (its uvicorn
server drains first, then stops: stopping sooner cuts SSE answers)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, cast

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server
from starlette.applications import Starlette
from starlette.types import Message, Receive, Scope, Send

from handles.errors import ConfigurationError, DatabaseUnreachable
from handles.server.bind_mcpserver import is_fastmcp
from handles.server.health import Readiness
from handles.server.older_tasks import OlderAnswers
from handles.server.stdio_stdout import LoopStdout, claimed_stdout

logger = logging.getLogger("handles")

# The largest request head `serve_http` reads whole (h11's default is 16 KiB): a long `Mcp-Name`
# header still reaches the app and gets its JSON-RPC error, however its bytes arrive.
REQUEST_HEAD_BYTES = 128 * 1024

if TYPE_CHECKING:
    from fastmcp import FastMCP

    from handles.app import Handles


async def serve_stdio(server: MCPServer[Any] | FastMCP[Any], handles: Handles) -> None:
    """Serve `server` over stdio with the job runtime running.

    On SIGTERM, SIGINT or stdin closing the runtime drains (see `Handles.aclose`); a second signal
    hands the running jobs over at once. While serving, a stray `print` goes to stderr.
    """
    stop = asyncio.Event()
    with shutdown_signals(handles, stop):  # installed until the drain below has ended
        async with handles.running():
            serving = asyncio.create_task(_serve_stdio(server), name="handles-stdio")
            stopping = asyncio.create_task(stop.wait())
            try:
                await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.set()  # stdin closed, or a signal came: from here on a signal ends the drain
                handles.begin_drain()
                stopping.cancel()
                serving.cancel()  # a no-op once it has ended
                with contextlib.suppress(asyncio.CancelledError):
                    await serving


@contextlib.contextmanager
def shutdown_signals(handles: Handles, stop: asyncio.Event) -> Iterator[None]:
    """For the block, SIGTERM and SIGINT set `stop` (the drain begins); a further signal ends the drain at once."""

    def on_signal() -> None:
        if stop.is_set():
            handles.end_drain()  # the drain has begun: this signal ends it
        stop.set()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, on_signal)
    try:
        yield
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signum)


async def _serve_stdio(server: MCPServer[Any] | FastMCP[Any]) -> None:
    """The server's stdio loop, writing stdout from the event loop (`LoopStdout`) where the SDK allows."""
    if is_fastmcp(server):
        return await cast("FastMCP[Any]", server).run_stdio_async(show_banner=False)
    lowlevel = cast("MCPServer[Any]", server)._lowlevel_server
    with claimed_stdout() as wire:
        stdout = None if wire is None else LoopStdout(wire)
        async with stdio_server(stdout=cast(Any, stdout)) as (read_stream, write_stream):
            await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())


def streamable_http_app(
    server: MCPServer[Any] | FastMCP[Any],
    handles: Handles,
    *,
    liveness_path: str | None = "/healthz",
    readiness_path: str | None = "/readyz",
    **options: Any,
) -> Starlette:
    """The server's stateless Streamable HTTP app, with the job runtime started and drained by its lifespan.

    `GET liveness_path` answers 200 while the process serves; `GET readiness_path` answers 200 only
    when the runtime runs, is not draining and the database answers, else 503 (None leaves a path out).
    Other options go to `MCPServer.streamable_http_app` or `FastMCP.http_app`. On both, a node listening on a
    loopback address refuses a foreign `Host` or `Origin` (DNS rebinding); FastMCP's own default, off, is
    taken back with `host_origin_protection=False`.
    """
    options.setdefault("stateless_http", True)
    app: Starlette
    if is_fastmcp(server):
        options.setdefault("host_origin_protection", "auto")
        app = cast("FastMCP[Any]", server).http_app(**options)
    else:
        app = cast("MCPServer[Any]", server).streamable_http_app(**options)
    app.add_middleware(OlderAnswers)  # answers to the 2025-11-25 design's questions, on any node
    readiness = Readiness(handles)
    app.router.routes[:0] = readiness.routes(liveness_path, readiness_path)
    inner = app.router.lifespan_context
    refused: list[ConfigurationError] = []

    @asynccontextmanager
    async def lifespan(scope_app: Any) -> AsyncIterator[None]:
        # A database that does not answer yet: serve anyway, not ready, retrying in the background.
        try:
            await readiness.begin()
        except ConfigurationError as exc:  # a missing key, an outdated schema: not transient
            refused.append(exc)
            raise
        try:
            async with inner(scope_app):
                yield
                handles.begin_drain()  # the server is stopping: refuse new work, answer long-polls now
        finally:
            await readiness.cancel()
            await handles.aclose()

    app.router.lifespan_context = lifespan
    protocol = app.router.lifespan

    async def start_refused_in_one_line(scope: Scope, receive: Receive, send: Send) -> None:
        """The router's lifespan protocol, a start refused by a `ConfigurationError` reported as its one
        sentence (which uvicorn logs instead of Starlette's traceback)."""

        async def send_sentence(message: Message) -> None:
            if message["type"] == "lifespan.startup.failed" and refused:
                message = {**message, "message": str(refused[-1])}
            await send(message)

        await protocol(scope, receive, send_sentence)

    app.router.lifespan = start_refused_in_one_line  # type: ignore[method-assign]
    return app


async def serve_http(
    server: MCPServer[Any] | FastMCP[Any],
    handles: Handles,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    liveness_path: str | None = "/healthz",
    readiness_path: str | None = "/readyz",
    **uvicorn_options: Any,
) -> None:
    """Serve `streamable_http_app(server, handles)` with uvicorn, draining well on SIGTERM.

    At the signal `/readyz` answers 503 and running jobs get `drain_seconds` to finish while the node
    still answers; a second signal stops at once. Set the termination grace period a few seconds longer.
    """
    app = streamable_http_app(server, handles, liveness_path=liveness_path, readiness_path=readiness_path)
    config = await uvicorn_config(app, handles, host=host, port=port, **uvicorn_options)
    health = ", ".join(path for path in (liveness_path, readiness_path) if path) or "off"
    await DrainingServer(config, handles, health=health).serve()


async def uvicorn_config(app: Starlette, handles: Handles, **uvicorn_options: Any) -> uvicorn.Config:
    """`app` (a `streamable_http_app`) as a node serves it (`serve_http`, `handles.testing.served`): the store
    prepared before listening, request heads up to `REQUEST_HEAD_BYTES` read whole."""
    with contextlib.suppress(DatabaseUnreachable):  # waited out in the background (handles.server.health)
        await handles.prepare()  # a missing key, a bad URL or an outdated schema stops here, before listening
    quiet_stateless_sessions()
    uvicorn_options.setdefault("log_level", "warning")
    uvicorn_options.setdefault("h11_max_incomplete_event_size", REQUEST_HEAD_BYTES)
    return uvicorn.Config(app, **uvicorn_options)


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
