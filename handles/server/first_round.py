"""What a plain `<job>` call does about the question its job asks before any work starts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mcp.server.context import ServerRequestContext
from mcp_types import (
    CallToolResult,
    ClientCapabilities,
    ElicitRequest,
    ElicitRequestFormParams,
    InputRequiredResult,
    TextContent,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from handles.ask_first import FIRST_KEY

if TYPE_CHECKING:
    from handles.jobs import JobSpec


def asks_in_band(protocol_version: str, capabilities: ClientCapabilities | None) -> bool:
    """Whether this request can take the question as an `InputRequiredResult`: 2026-07-28 with elicitation."""
    return protocol_version in MODERN_PROTOCOL_VERSIONS and bool(capabilities and capabilities.elicitation)


@dataclass(frozen=True)
class FirstRound:
    """What a plain `<job>` call does about the question before the job: exactly one field is set, or none."""

    ask: InputRequiredResult | None = None
    declined: CallToolResult | None = None
    answer: dict[str, Any] | None = None

    @property
    def reply(self) -> InputRequiredResult | CallToolResult | None:
        """What the call answers before any job exists (the question, or the refusal), or None."""
        return self.ask or self.declined


def first_round(
    spec: JobSpec,
    arguments: dict[str, Any],
    ctx: ServerRequestContext[Any, Any],
    responses: Mapping[str, Any] | None,
) -> FirstRound:
    """Decide what a plain `<job>` call does before the job exists (arguments are validated here)."""
    in_band = asks_in_band(ctx.protocol_version, ctx.session.client_capabilities)
    if spec.ask_first is None or not in_band:
        return FirstRound()
    response = (responses or {}).get(FIRST_KEY)
    if response is None:
        values = spec.validate_arguments(arguments, f"Fix the arguments and call {spec.name} again.")
        request = ElicitRequest(
            params=ElicitRequestFormParams(
                message=spec.ask_first.render(values),
                requested_schema=spec.ask_first.requested_schema(),
            )
        )
        return FirstRound(ask=InputRequiredResult(input_requests={FIRST_KEY: request}))
    action = _field(response, "action")
    if action != "accept":
        text = f"{spec.name} was not started: the question before it was {action or 'not answered'}."
        return FirstRound(
            declined=CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)
        )
    content = _field(response, "content")
    return FirstRound(answer=dict(content) if isinstance(content, Mapping) else {})


def _field(response: Any, name: str) -> Any:
    if isinstance(response, Mapping):
        return response.get(name)
    return getattr(response, name, None)
