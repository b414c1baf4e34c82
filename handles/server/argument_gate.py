"""The argument gate: server middleware that checks every generated tool's arguments before the SDK does.

Mistakes (unknown names and deep nesting included) get the `{error, message, next}` shape.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata, func_metadata
from pydantic import ValidationError

from handles.errors import CallerError, InvalidArguments
from handles.limits import clean_message
from handles.server.envelope import SdkServer, enveloped, server_info
from handles.server.tool_shapes import refusal

MAX_NESTING = 64
"""How deep arguments may nest (objects and arrays); far beyond any job's needs, far below the SDK's limits."""


@dataclass(frozen=True)
class ArgumentRules:
    """What one tool accepts, checked the way the SDK will, plus unknown names and nesting."""

    tool: str
    metadata: FuncMetadata
    """The SDK's view of the registered function: the same argument model, JSON pre-parsing and output schema."""
    schema: dict[str, Any]
    accepted: tuple[str, ...]

    @classmethod
    def of(cls, tool: str, function: Callable[..., Any], context_param: str) -> ArgumentRules:
        metadata = func_metadata(function, skip_names=[context_param], structured_output=True)
        schema = metadata.arg_model.model_json_schema(by_alias=True)
        return cls(tool=tool, metadata=metadata, schema=schema, accepted=tuple(schema.get("properties", {})))

    @property
    def usage(self) -> str:
        """`handle (string, required), wait_seconds (number >= 0, optional)`: what a correct call passes."""
        required = set(self.schema.get("required", ()))
        parts = [
            f"{name} ({_expected(prop, self.schema)}, {'required' if name in required else 'optional'})"
            for name, prop in self.schema.get("properties", {}).items()
        ]
        return ", ".join(parts) or "no arguments"

    def check(self, arguments: Mapping[str, Any]) -> CallerError | None:
        """None when the SDK will accept `arguments` as they are; otherwise the caller error to answer."""
        depth = nesting(arguments)
        if depth > MAX_NESTING:
            return InvalidArguments(
                f"The arguments of {self.tool} are nested {depth} levels deep; the limit is {MAX_NESTING}.",
                f"Call {self.tool} again with {self.usage}.",
                data={"limit_nesting": MAX_NESTING},
            )
        unknown = [name for name in arguments if name not in self.accepted]
        if unknown:
            shown = ", ".join(clean_message(name, 60) or "''" for name in unknown[:5])
            return InvalidArguments(
                f"{self.tool} has no argument named {shown}; it accepts "
                f"{', '.join(self.accepted) or 'no arguments'}.",
                f"Remove or rename the unknown argument{'s' if len(unknown) > 1 else ''}: call {self.tool} "
                f"again with {self.usage}.",
                data={"accepted": list(self.accepted)},
            )
        problems = self._booleans_for_numbers(arguments)
        if not problems:
            try:
                self.metadata.validate_arguments(dict(arguments))
            except ValidationError as exc:
                problems = [_problem(error, self.schema) for error in exc.errors()]
        if problems:
            return InvalidArguments(
                f"Invalid arguments for {self.tool}: " + "; ".join(problems) + ".",
                f"Call {self.tool} again with {self.usage}.",
            )
        return None

    def _booleans_for_numbers(self, arguments: Mapping[str, Any]) -> list[str]:
        """A problem for each `true` or `false` given for a number: pydantic's lax mode reads `true` as 1,
        JSON does not (`wait_seconds: true` is a mistake, not one second)."""
        problems = []
        properties = self.schema.get("properties", {})
        for name, value in arguments.items():
            types = _json_types(properties.get(name, {}))
            if isinstance(value, bool) and types & {"number", "integer"} and "boolean" not in types:
                kind = "number" if "number" in types else "integer"
                expected = _expected(properties[name], self.schema)
                problems.append(
                    f"{name}: should be a valid {kind}, not {str(value).lower()} (expected {expected})"
                )
        return problems


def nesting(value: Any) -> int:
    """How deep `value` nests objects and arrays (a scalar is 0, `{}` is 1), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _problem(error: Any, schema: dict[str, Any]) -> str:
    """`wait_seconds: should be greater than or equal to 0`, without echoing the rejected value."""
    location = ".".join(str(part) for part in error["loc"]) or "arguments"
    top = str(error["loc"][0]) if error["loc"] else ""
    expected = _expected(schema.get("properties", {}).get(top, {}), schema) if top else "an object"
    if error["type"] == "missing":
        return f"{location} is required ({expected}) but missing"
    message = str(error["msg"])
    if message.startswith("Input should be "):
        message = "should be " + message.removeprefix("Input should be ")
        message = message.replace("a valid dictionary", "an object").replace("a valid list", "a list")
    elif message.startswith("Value error, "):
        message = message.removeprefix("Value error, ")
    return f"{location}: {message} (expected {expected})"


def _json_types(prop: Mapping[str, Any]) -> set[str]:
    """The JSON types a property's schema names, its `anyOf` options' included."""
    types = prop.get("type", ())
    found = {types} if isinstance(types, str) else set(types)
    for option in prop.get("anyOf", ()):
        found |= _json_types(option)
    return found


_TYPE_NAMES = {"array": "list", "object": "object", "integer": "integer", "number": "number"}
_BOUNDS = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}


def _expected(prop: Mapping[str, Any], schema: Mapping[str, Any]) -> str:
    """A short human description of a property's JSON schema: `number >= 0`, `string or null`."""
    if "$ref" in prop:
        name = str(prop["$ref"]).rsplit("/", 1)[-1]
        prop = schema.get("$defs", {}).get(name, {"type": "object"})
    if "enum" in prop:
        return "one of " + ", ".join(repr(v) for v in prop["enum"])
    if "anyOf" in prop:
        return " or ".join(_expected(option, schema) for option in prop["anyOf"])
    kind = str(prop.get("type", "any value"))
    text = _TYPE_NAMES.get(kind, kind)
    if "minimum" in prop and "maximum" in prop:
        return f"{text} from {prop['minimum']:g} to {prop['maximum']:g}"
    bounds = [f"{symbol} {prop[key]:g}" for key, symbol in _BOUNDS.items() if key in prop]
    if "minLength" in prop or "maxLength" in prop:
        bounds.append(f"{prop.get('minLength', 0)} to {prop.get('maxLength', 'any number of')} characters")
    return " ".join([text, *bounds])


class ArgumentGate:
    """Server middleware checking the arguments of the generated tools before the SDK sees them."""

    def __init__(self, info: dict[str, Any]) -> None:
        self._rules: dict[str, ArgumentRules] = {}
        self._server_info = info

    @classmethod
    def of(cls, server: SdkServer) -> ArgumentGate:
        """The gate installed on `server`, installing one (innermost of its middleware) if there is none."""
        for middleware in server.middleware:
            if isinstance(middleware, cls):
                return middleware
        gate = cls(server_info(server))
        server.middleware.append(gate)
        return gate

    def register(self, rules: ArgumentRules) -> None:
        self._rules[rules.tool] = rules

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method == "tools/list":
            return self._closed_schemas(await call_next(ctx))
        if ctx.method == "tools/call" and isinstance(ctx.params, Mapping):
            rules = self._rules.get(ctx.params.get("name"))  # type: ignore[arg-type]
            arguments = ctx.params.get("arguments")
            if rules is not None and (arguments is None or isinstance(arguments, Mapping)):
                error = rules.check(arguments or {})
                if error is not None:  # the tool error, in the envelope the SDK puts on every other result
                    result = refusal(error).model_dump(by_alias=True, mode="json", exclude_none=True)
                    return enveloped(ctx, result, self._server_info)
        return await call_next(ctx)

    def _closed_schemas(self, result: HandlerResult) -> HandlerResult:
        """`additionalProperties: false` on the input schema of every gated tool (the result is on the wire already)."""
        if isinstance(result, dict):
            for tool in result.get("tools") or ():
                if isinstance(tool, dict) and tool.get("name") in self._rules:
                    tool["inputSchema"] = {**tool.get("inputSchema", {}), "additionalProperties": False}
        return result
