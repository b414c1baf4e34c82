"""Serving a bound server with its job runtime: stdio, the Streamable HTTP app, and `serve_http`.

Each helper takes an `MCPServer` or a FastMCP server. The runtime starts with the server and
drains on SIGTERM (see `Handles.aclose`); the HTTP app carries the health routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, cast

from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server
from starlette.applications import Starlette
from starlette.types import Message, Receive, Scope, Send

from handles.errors import ConfigurationError, DatabaseUnreachable
from handles.server.bind_mcpserver import is_fastmcp
from handles.server.health import health_routes
from handles.server.startup import BackgroundStart
from handles.server.stdio_stdout import LoopStdout, claimed_stdout

# The largest request head (request line and headers) `serve_http` reads whole. A 2026-07-28 client
# mirrors `params.taskId` or a tool's name into the `Mcp-Name` header, so a made-up id makes the head
# long; uvicorn's HTTP parser (h11) refuses a head over its limit only while the head is incomplete, so
# below this size every such request reaches the app and gets its JSON-RPC error, whether its bytes
# arrive in one read or several (a proxy, a loaded machine). h11's own default is 16 KiB.
REQUEST_HEAD_BYTES = 128 * 1024

if TYPE_CHECKING:
    from fastmcp import FastMCP

    from handles.app import Handles


async def serve_stdio(server: MCPServer[Any] | FastMCP[Any], handles: Handles) -> None:
    """Serve `server` over stdio with the job runtime running.

    On SIGTERM or SIGINT, or when stdin closes, the runtime drains: no new work, running jobs may
    finish for `drain_seconds`, the rest is handed over (see `Handles.aclose`). A signal during the
    drain ends it at once (`Handles.end_drain`): the running jobs are handed over now. That is how a
    client ends a stdio server (the specification's stdio shutdown, which the official SDKs follow):
    it closes stdin, waits 2 s, sends SIGTERM, waits 2 s, sends SIGKILL. So running jobs have those
    2 s to finish, and are handed over at the SIGTERM rather than killed holding their leases.

    An `MCPServer`'s replies are written to stdout from the event loop, not from a worker thread as the
    SDK's `stdio_server` writes them, so a reply never waits for a job's step to let go of the GIL
    (handles/server/stdio_stdout.py). fd 1 is claimed as the SDK claims it: while serving, a stray
    `print` goes to stderr, not onto the wire. A FastMCP server is served by its own `run_stdio_async`.
    """
    stop = asyncio.Event()
    with shutdown_signals(handles, stop):  # installed until the drain below has ended
        async with handles.running():
            serving = asyncio.create_task(_stdio_serving(server), name="handles-stdio")
            stopping = asyncio.create_task(stop.wait())
            try:
                await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.set()  # stdin closed, or a signal came: from here on a signal ends the drain
                handles.begin_drain()
                stopping.cancel()
                if not serving.done():
                    serving.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await serving


@contextlib.contextmanager
def shutdown_signals(handles: Handles, stop: asyncio.Event) -> Iterator[None]:
    """For the block, SIGTERM and SIGINT set `stop` (the process begins to stop: it drains); once `stop` is
    set, by a signal or by the caller, a further signal ends the drain at once (`Handles.end_drain`).
    Where the event loop can take signals (`serve_stdio`, `handles worker`)."""

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


def _stdio_serving(server: MCPServer[Any] | FastMCP[Any]) -> Coroutine[Any, Any, None]:
    """The server's stdio loop. An `MCPServer` runs its low-level server as `run_stdio_async` does, with the
    SDK's `stdio_server` reading stdin and `LoopStdout` writing stdout on the event loop (see
    handles/server/stdio_stdout.py); a FastMCP server (its own lifespan and logging around the same
    loop), or an SDK without the low-level server this relies on, runs its own `run_stdio_async`."""
    if is_fastmcp(server):
        return cast("FastMCP[Any]", server).run_stdio_async(show_banner=False)
    lowlevel = getattr(server, "_lowlevel_server", None)
    if lowlevel is None:
        return cast("MCPServer[Any]", server).run_stdio_async()
    return _run_stdio(lowlevel)


async def _run_stdio(lowlevel: Any) -> None:
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

    The runtime starts before the SDK's session manager and stops after it, so requests in
    flight finish against a running runtime; its shutdown drains (see `Handles.aclose`).
    Serve it with `serve_http` to start the drain as soon as the shutdown signal arrives.

    `GET liveness_path` answers 200 while the process serves; `GET readiness_path` answers 200
    only when the runtime runs, is not draining and the database answers, else 503 with the
    reason (see `handles.server.health`). Either path may be None to leave it out; neither needs a token.
    Other options are passed to `MCPServer.streamable_http_app`, or to `FastMCP.http_app` for a
    FastMCP server (`stateless_http=True` by default on both).
    """
    options.setdefault("stateless_http", True)
    app = (
        cast("FastMCP[Any]", server).http_app(**options)
        if is_fastmcp(server)
        else cast("MCPServer[Any]", server).streamable_http_app(**options)
    )
    starter = BackgroundStart(handles)
    app.router.routes[:0] = health_routes(
        handles, liveness_path=liveness_path, readiness_path=readiness_path, startup_problem=starter.problem
    )
    inner = app.router.lifespan_context
    refused: list[ConfigurationError] = []

    @asynccontextmanager
    async def lifespan(scope_app: Any) -> AsyncIterator[None]:
        # A database that does not answer yet: serve anyway, not ready, retrying in the background.
        try:
            await starter.begin()
        except ConfigurationError as exc:  # a missing key, an outdated schema: not transient
            refused.append(exc)
            raise
        try:
            async with inner(scope_app):
                yield
                handles.begin_drain()  # the server is stopping: refuse new work, answer long-polls now
        finally:
            await starter.cancel()
            await handles.aclose()

    app.router.lifespan_context = lifespan
    app.router.lifespan = _start_refused_in_one_line(app.router.lifespan, refused)  # type: ignore[method-assign,assignment]
    return app


LifespanProtocol = Callable[[Scope, Receive, Send], Coroutine[Any, Any, None]]


def _start_refused_in_one_line(
    protocol: LifespanProtocol, refused: list[ConfigurationError]
) -> LifespanProtocol:
    """The router's lifespan protocol, with a start refused by a `ConfigurationError` reported as its one
    sentence: the ASGI server (uvicorn run by hand) logs that message instead of Starlette's traceback."""

    async def lifespan_protocol(scope: Scope, receive: Receive, send: Send) -> None:
        async def send_sentence(message: Message) -> None:
            if message["type"] == "lifespan.startup.failed" and refused:
                message = {**message, "message": str(refused[-1])}
            await send(message)

        await protocol(scope, receive, send_sentence)

    return lifespan_protocol


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

    At the signal the runtime stops taking work and answers long-polls at once, and
    `/readyz` answers 503; the node keeps listening while running jobs finish (for up to
    `drain_seconds`), so probes and retried calls get an answer rather than a refused
    connection. Then uvicorn stops, and the lifespan hands over what is left. A second
    signal stops at once. A deployment's termination grace period should exceed
    `drain_seconds` by a few seconds (the default 25 fits Kubernetes' 30).
    """
    import uvicorn

    from handles.server.http_server import DrainingServer, quiet_stateless_sessions

    with contextlib.suppress(DatabaseUnreachable):  # waited out in the background (handles.server.startup)
        await handles.prepare()  # a missing key, a bad URL or an outdated schema stops here, before listening
    quiet_stateless_sessions()
    uvicorn_options.setdefault("log_level", "warning")
    uvicorn_options.setdefault("h11_max_incomplete_event_size", REQUEST_HEAD_BYTES)
    app = streamable_http_app(server, handles, liveness_path=liveness_path, readiness_path=readiness_path)
    health = ", ".join(path for path in (liveness_path, readiness_path) if path) or "off"
    config = uvicorn.Config(app, host=host, port=port, **uvicorn_options)
    await DrainingServer(config, handles, health=health).serve()
