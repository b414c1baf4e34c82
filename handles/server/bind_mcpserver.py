"""Binding generated tools to the official SDK's `MCPServer` (and the tool functions the FastMCP binding reuses)."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, InputRequiredResult, ToolAnnotations
from pydantic import BaseModel, SecretStr
from pydantic_core import to_jsonable_python

from handles.errors import ConfigurationError, InvalidArguments
from handles.principal import PrincipalResolver
from handles.server.argument_gate import ArgumentGate, ArgumentRules
from handles.server.envelope import SdkServer
from handles.server.tool_shapes import ToolDefinition, refusal, to_call_tool_result

CONTEXT_PARAM = "mcp_context"

PlainHandler = Callable[
    [str, dict[str, Any], "Context[Any, Any]"], Awaitable[CallToolResult | InputRequiredResult]
]
"""`(principal, arguments, request context) -> result` of a tool that builds its own result (or asks first)."""
SdkFunction = Callable[..., Awaitable[CallToolResult | InputRequiredResult]]
"""A tool function as the SDK registers it: its parameters and `mcp_context`, read from its signature."""


def is_fastmcp(server: object) -> bool:
    """Whether `server` is a FastMCP server (told without importing FastMCP where it is not installed)."""
    module = sys.modules.get("fastmcp")
    return module is not None and isinstance(server, module.FastMCP)


async def resolve_principal(resolver: PrincipalResolver, context: Any) -> str:
    principal = resolver(context)
    if inspect.isawaitable(principal):
        principal = await principal
    if not principal:
        raise ConfigurationError("the principal resolver returned no principal for this request")
    return principal


@dataclass(frozen=True)
class SdkTool:
    """A generated tool as both bindings register it: its SDK function and what `tools/list` shows of it."""

    function: SdkFunction
    name: str
    title: str
    description: str
    annotations: ToolAnnotations
    meta: dict[str, Any] | None = None


def handle_tool(definition: ToolDefinition, resolver: PrincipalResolver) -> SdkTool:
    """A handle tool as the bindings register it, its function with a signature the SDK can read."""

    async def handle(principal: str, arguments: dict[str, Any], _context: Context) -> CallToolResult:
        return to_call_tool_result(await definition.handler(principal, arguments))

    returns = Annotated[CallToolResult, definition.output_model]
    function = sdk_function(definition.name, definition.input_model, resolver, handle, returns)
    annotations = tool_annotations(
        definition.title, definition.read_only, definition.destructive, definition.idempotent
    )
    return SdkTool(function, definition.name, definition.title, definition.description, annotations)


def tool_annotations(title: str, read_only: bool, destructive: bool, idempotent: bool) -> ToolAnnotations:
    return ToolAnnotations(
        title=title,
        read_only_hint=read_only,
        destructive_hint=destructive,
        idempotent_hint=idempotent,
        open_world_hint=False,
    )


def sdk_function(
    name: str, model: type[BaseModel], resolver: PrincipalResolver, handler: PlainHandler, returns: Any
) -> SdkFunction:
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


def add_tools(server: MCPServer[Any], tools: list[SdkTool]) -> SdkServer:
    """Register `tools` on `server` (returned), their arguments checked by the server's argument gate first."""
    gate = ArgumentGate.of(server)
    for tool in tools:
        gate.register(ArgumentRules.of(tool.name, tool.function, CONTEXT_PARAM))
        server.add_tool(
            tool.function,
            name=tool.name,
            title=tool.title,
            description=tool.description,
            annotations=tool.annotations,
            meta=tool.meta,
            structured_output=True,
        )
    return server
