"""Binding generated tools to the official SDK's `MCPServer`.

Each `ToolDefinition` becomes an ordinary SDK tool through `MCPServer.add_tool`:
a function whose signature is synthesised from the definition's input model (so
the SDK derives the same `inputSchema`) and whose return annotation
`Annotated[CallToolResult, OutputModel]` makes the SDK publish the `outputSchema`
and check every structured result against it. The arguments of every tool added
here are checked first by the server's `ArgumentGate` (handles/arguments.py), so
a caller's mistake gets the `{error, message, next}` shape. No JSON-RPC here.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Annotated, Any, cast

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, ContentBlock, InputRequiredResult, TextContent, ToolAnnotations
from pydantic import BaseModel, SecretStr
from pydantic_core import to_jsonable_python
from starlette.applications import Starlette

from handles.arguments import ArgumentGate, ArgumentRules
from handles.errors import CallerError, ConfigurationError, DatabaseUnreachable, InvalidArguments
from handles.health import health_routes
from handles.principal import PrincipalResolver
from handles.results import resource_link
from handles.startup import BackgroundStart
from handles.tools import ToolDefinition, ToolReply, error_reply

if TYPE_CHECKING:
    from fastmcp import FastMCP

    from handles.app import Handles

logger = logging.getLogger("handles")

CONTEXT_PARAM = "mcp_context"

PlainHandler = Callable[
    [str, dict[str, Any], "Context[Any, Any]"], Awaitable[CallToolResult | InputRequiredResult]
]
"""`(principal, arguments, request context) -> result` of a tool that builds its own result (or asks first)."""


def is_fastmcp(server: object) -> bool:
    """Whether `server` is a FastMCP server (told without importing FastMCP where it is not installed)."""
    module = sys.modules.get("fastmcp")
    return module is not None and isinstance(server, module.FastMCP)


def to_call_tool_result(reply: ToolReply) -> CallToolResult:
    """Structured content plus the same JSON as text; caller errors carry text only."""
    content: list[ContentBlock] = [TextContent(type="text", text=reply.text)]
    if reply.is_error and "error" in reply.structured and "status" not in reply.structured:
        return CallToolResult(content=content, is_error=True)
    if reply.link is not None:
        content.append(resource_link(reply.link))
    return CallToolResult(content=content, structured_content=reply.structured, is_error=reply.is_error)


async def resolve_principal(resolver: PrincipalResolver, context: Any) -> str:
    principal = resolver(context)
    if inspect.isawaitable(principal):
        principal = await principal
    if not principal:
        raise ConfigurationError("the principal resolver returned no principal for this request")
    return principal


def tool_function(
    definition: ToolDefinition, resolver: PrincipalResolver
) -> Callable[..., Awaitable[CallToolResult | InputRequiredResult]]:
    """An SDK tool function for `definition`, with a signature the SDK can read."""

    async def handle(principal: str, arguments: dict[str, Any], _context: Context) -> CallToolResult:
        return to_call_tool_result(await definition.handler(principal, arguments))

    returns = Annotated[CallToolResult, definition.output_model]
    return _sdk_function(definition.name, definition.input_model, resolver, handle, returns)


def plain_tool_function(
    name: str, input_model: type[BaseModel], resolver: PrincipalResolver, handler: PlainHandler
) -> Callable[..., Awaitable[CallToolResult | InputRequiredResult]]:
    """An SDK tool function that hands the request's `Context` to `handler` and declares no output schema."""
    return _sdk_function(name, input_model, resolver, handler, CallToolResult)


def _sdk_function(
    name: str, model: type[BaseModel], resolver: PrincipalResolver, handler: PlainHandler, returns: Any
) -> Callable[..., Awaitable[CallToolResult | InputRequiredResult]]:
    if CONTEXT_PARAM in model.model_fields:
        raise ConfigurationError(f"{name}: a parameter may not be named {CONTEXT_PARAM!r}")

    async def call(**kwargs: Any) -> CallToolResult | InputRequiredResult:
        context = kwargs.pop(CONTEXT_PARAM)
        principal = await resolve_principal(resolver, context)
        try:
            arguments = {key: _jsonable(value) for key, value in kwargs.items()}
        except UnicodeEncodeError:  # a lone surrogate (JSON "\ud800") in an object key
            error = InvalidArguments(
                f"The arguments of {name} contain text that is not valid Unicode (a lone surrogate).",
                f"Fix the arguments and call {name} again.",
            )
            return refusal(error)
        return await handler(principal, arguments, context)

    parameters = [_parameter(key, field) for key, field in model.model_fields.items()]
    parameters.append(inspect.Parameter(CONTEXT_PARAM, inspect.Parameter.KEYWORD_ONLY, annotation=Context))
    call.__signature__ = inspect.Signature(parameters, return_annotation=returns)  # type: ignore[attr-defined]
    call.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": returns}
    call.__name__ = name
    call.__qualname__ = name
    return call


def _jsonable(value: Any) -> Any:
    """An argument as JSON; a `SecretStr` keeps its real value (JSON mode would mask it), for the store to seal."""
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    return to_jsonable_python(value, by_alias=True)


def _parameter(name: str, field: Any) -> inspect.Parameter:
    annotation = Annotated[field.annotation, field]
    default = inspect.Parameter.empty if field.is_required() else field.get_default(call_default_factory=True)
    return inspect.Parameter(
        field.alias or name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default
    )


def refusal(error: CallerError) -> CallToolResult:
    """A caller error as the tool result every generated tool answers it with."""
    return to_call_tool_result(error_reply(error))


def _gated(server: MCPServer[Any], name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, its arguments now checked by the server's argument gate before the SDK's validation."""
    ArgumentGate.of(server, refusal).register(ArgumentRules.of(name, function, CONTEXT_PARAM))
    return function


def handle_tool_annotations(definition: ToolDefinition) -> ToolAnnotations:
    """The annotations of a generated handle tool (the same on every framework)."""
    return ToolAnnotations(
        title=definition.title,
        read_only_hint=definition.read_only,
        destructive_hint=definition.destructive,
        idempotent_hint=definition.idempotent,
        open_world_hint=False,
    )


def plain_tool_annotations(title: str) -> ToolAnnotations:
    """The annotations of a job's plain tool `<job>`: it starts work, never destructive by itself."""
    return ToolAnnotations(
        title=title,
        read_only_hint=False,
        destructive_hint=False,
        idempotent_hint=False,
        open_world_hint=False,
    )


def add_tools(server: MCPServer[Any], definitions: list[ToolDefinition], resolver: PrincipalResolver) -> None:
    """Register every definition on `server` as an ordinary tool."""
    for definition in definitions:
        server.add_tool(
            _gated(server, definition.name, tool_function(definition, resolver)),
            name=definition.name,
            title=definition.title,
            description=definition.description,
            annotations=handle_tool_annotations(definition),
            structured_output=True,
        )


def add_plain_tool(
    server: MCPServer[Any],
    *,
    name: str,
    title: str,
    description: str,
    input_model: type[BaseModel],
    handler: PlainHandler,
    resolver: PrincipalResolver,
    meta: dict[str, Any] | None = None,
) -> None:
    """Register a tool that answers its own `CallToolResult` (a job's plain tool `<job>`)."""
    server.add_tool(
        _gated(server, name, plain_tool_function(name, input_model, resolver, handler)),
        name=name,
        title=title,
        description=description,
        meta=meta,
        annotations=plain_tool_annotations(title),
    )


async def serve_stdio(server: MCPServer[Any] | FastMCP[Any], handles: Handles) -> None:
    """Serve `server` over stdio with the job runtime running.

    On SIGTERM or SIGINT (or when stdin closes) the runtime drains: no new work, running
    jobs may finish for `drain_seconds`, the rest is handed over (see `Handles.aclose`).
    """
    async with handles.running():
        running = (
            cast("FastMCP[Any]", server).run_stdio_async(show_banner=False)
            if is_fastmcp(server)
            else cast("MCPServer[Any]", server).run_stdio_async()
        )
        serving = asyncio.create_task(running, name="handles-stdio")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, stop.set)
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(signum)
            handles.begin_drain()
            stopping.cancel()
            if not serving.done():
                serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving


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
    reason (see `handles.health`). Either path may be None to leave it out; neither needs a token.
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

    @asynccontextmanager
    async def lifespan(scope_app: Any) -> AsyncIterator[None]:
        # A database that does not answer yet: serve anyway, not ready, retrying in the background.
        await starter.begin()
        try:
            async with inner(scope_app):
                yield
                handles.begin_drain()  # the server is stopping: refuse new work, answer long-polls now
        finally:
            await starter.cancel()
            await handles.aclose()

    app.router.lifespan_context = lifespan
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

    At the signal the runtime stops taking work and answers long-polls at once, and
    `/readyz` answers 503; the node keeps listening while running jobs finish (for up to
    `drain_seconds`), so probes and retried calls get an answer rather than a refused
    connection. Then uvicorn stops, and the lifespan hands over what is left. A second
    signal stops at once. A deployment's termination grace period should exceed
    `drain_seconds` by a few seconds (the default 25 fits Kubernetes' 30).
    """
    import uvicorn

    from handles.http_server import DrainingServer, quiet_stateless_sessions

    with contextlib.suppress(DatabaseUnreachable):  # waited out in the background (handles.startup)
        await handles.prepare()  # a missing key, a bad URL or an outdated schema stops here, before listening
    quiet_stateless_sessions()
    uvicorn_options.setdefault("log_level", "warning")
    app = streamable_http_app(server, handles, liveness_path=liveness_path, readiness_path=readiness_path)
    health = ", ".join(path for path in (liveness_path, readiness_path) if path) or "off"
    config = uvicorn.Config(app, host=host, port=port, **uvicorn_options)
    await DrainingServer(config, handles, health=health).serve()
