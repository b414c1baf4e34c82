"""Binding the same jobs to a FastMCP 4 server, with the same tools, answers and errors as on `MCPServer`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from fastmcp import FastMCP
from fastmcp.server.dependencies import fastmcp_request_ctx, get_context
from fastmcp.server.extensions import MethodBinding, ServerExtension, ToolCallContinuation, ToolCallOutcome
from fastmcp.tools.base import InputRequiredToolResult, Tool, ToolResult
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    InputRequiredResult,
    SubscriptionsListenRequestParams,
)
from pydantic import PrivateAttr, ValidationError

from handles.errors import ConfigurationError
from handles.server.argument_gate import ArgumentGate, ArgumentRules
from handles.server.bind_mcpserver import CONTEXT_PARAM, SdkFunction, SdkTool
from handles.server.envelope import SdkServer
from handles.server.tasks_extension import TasksExtension
from handles.server.tool_shapes import refusal
from handles.tasks_wire import TASKS_EXTENSION

if TYPE_CHECKING:
    from fastmcp.server.context import Context as FastMCPContext
    from mcp.server.lowlevel.server import Server as LowLevelServer


def sdk_request_context() -> ServerRequestContext[Any, Any]:
    """The SDK's request context of the FastMCP request being served."""
    current = fastmcp_request_ctx.get()
    if current is None:
        raise ConfigurationError("A handles tool ran outside a FastMCP request; call it through the server.")
    return current._srctx


def low_level(server: FastMCP[Any]) -> LowLevelServer[Any]:
    """FastMCP's low-level server: the SDK's `Server`, whose middleware list the SDK middleware joins."""
    return cast("LowLevelServer[Any]", server._mcp_server)


class JobTool(Tool):
    """A generated tool on FastMCP: validated by the SDK's argument model, run by the shared function."""

    _function: SdkFunction = PrivateAttr()
    _rules: ArgumentRules = PrivateAttr()

    @classmethod
    def of(cls, sdk_tool: SdkTool, gate: ArgumentGate) -> JobTool:
        """The tool, its rules (the same `run` validates with) registered with the server's argument gate."""
        rules = ArgumentRules.of(sdk_tool.name, sdk_tool.function, CONTEXT_PARAM)
        gate.register(rules)
        tool = cls(
            name=sdk_tool.name,
            title=sdk_tool.title,
            description=sdk_tool.description,
            parameters=rules.schema,
            output_schema=rules.metadata.output_schema,
            annotations=sdk_tool.annotations,
            meta=sdk_tool.meta,
        )
        tool._function = sdk_tool.function
        tool._rules = rules
        return tool

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        try:
            validated = self._rules.metadata.validate_arguments(arguments)
        except ValidationError:
            # The argument gate refuses these first; one that gets here still gets the gate's answer.
            error = self._rules.check(arguments)
            assert error is not None
            return as_tool_result(refusal(error))
        params = CallToolRequestParams(
            name=self.name, arguments=arguments, input_responses=get_context().input_responses
        )
        context: Context[Any, Any] = Context(request_context=sdk_request_context(), input_params=params)
        result = await self._rules.metadata.call_fn(self._function, True, validated, {CONTEXT_PARAM: context})
        return as_tool_result(result)


def as_tool_result(result: CallToolResult | InputRequiredResult) -> ToolResult:
    """The SDK result as FastMCP's `ToolResult` (an in-band question as its `InputRequiredToolResult`)."""
    if isinstance(result, InputRequiredResult):
        return InputRequiredToolResult(result)
    return ToolResult(
        content=list(result.content),
        structured_content=result.structured_content,
        meta=result.meta,
        is_error=bool(result.is_error),
    )


class FastMCPTasks(ServerExtension):
    """The Tasks extension on FastMCP's extension seam, served by the same `TasksExtension`."""

    identifier = TASKS_EXTENSION

    def __init__(self, tasks: TasksExtension) -> None:
        self.tasks = tasks

    def clone(self) -> FastMCPTasks:
        return FastMCPTasks(self.tasks)  # the jobs and their store are shared, never copied

    def methods(self) -> Sequence[MethodBinding]:
        return [
            MethodBinding(method=binding.method, params_type=binding.params_type, handler=binding.handler)
            for binding in self.tasks.methods()
        ]

    async def intercept_tool_call(
        self, params: CallToolRequestParams, context: FastMCPContext, call_next: ToolCallContinuation
    ) -> ToolCallOutcome:
        outcome = await self.tasks.task_for_call(
            params.name, params.arguments, params.input_responses, sdk_request_context()
        )
        if outcome is None:
            return await call_next()
        # Not a ToolResult: the SDK's runner serialises it for the negotiated version, as on MCPServer.
        return cast("ToolCallOutcome", outcome)


def add_fastmcp_tools(server: FastMCP[Any], tools: list[SdkTool], tasks: TasksExtension | None) -> SdkServer:
    """Add the jobs' tools to a FastMCP server and, given `tasks`, its Tasks face; its low-level server."""
    if tasks is not None:
        _refuse_second_tasks_face(server)
    sdk_server = low_level(server)
    gate = ArgumentGate.of(sdk_server)
    for sdk_tool in tools:
        server.add_tool(JobTool.of(sdk_tool, gate))
    if tasks is not None:
        server.add_extension(FastMCPTasks(tasks))
        if "subscriptions/listen" not in sdk_server._request_handlers:  # what the pushed task status rides on
            listen = ListenHandler(InMemorySubscriptionBus())
            sdk_server.add_request_handler("subscriptions/listen", SubscriptionsListenRequestParams, listen)
    return sdk_server


def _refuse_second_tasks_face(server: FastMCP[Any]) -> None:
    existing = getattr(server, "_extensions", {}).get(TASKS_EXTENSION)
    if existing is None or isinstance(existing, FastMCPTasks):
        return
    raise ConfigurationError(
        f"This FastMCP server already serves the {TASKS_EXTENSION} extension "
        f"({type(existing).__module__}.{type(existing).__name__}, e.g. from fastmcp-tasks), and two "
        "implementations cannot share tasks/get. Bind the jobs with jobs.bind(server, tasks=False): they "
        "keep their plain and handle tools and the other extension keeps its own task tools; or turn those "
        "tools into @jobs.job functions and drop the other extension."
    )
