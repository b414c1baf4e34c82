"""What a handle tool is and what it answers: `ToolReply`, its output models, and `ToolDefinition`."""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mcp_types import CallToolResult, ContentBlock, TextContent
from pydantic import BaseModel, Field, create_model

from handles.errors import CallerError
from handles.results import ResultLink, resource_link
from handles.server.output_schema import FlatSchemaModel
from handles.states import Status
from handles.store import InputRequestRecord


class ProgressView(BaseModel):
    done: float | None = Field(None, description="Units of work done so far, as reported by the job.")
    total: float | None = Field(None, description="Total units of work, when the job knows it.")
    fraction: float | None = Field(None, description="done / total between 0 and 1, when both are known.")


class InputRequestView(BaseModel):
    message: str = Field(description="The question, for a person or for you to answer.")
    requested_schema: dict[str, Any] = Field(
        description="JSON schema of the answer: an object of primitive fields."
    )


class StepView(BaseModel):
    name: str
    status: str = Field(description="started (outcome not yet recorded), completed, or failed.")
    attempt: int
    started_at: datetime
    finished_at: datetime | None = None


class ErrorView(BaseModel):
    code: int
    message: str
    data: dict[str, Any] | None = None


class StartOutput(FlatSchemaModel):
    handle: str = Field(description="Pass this to the progress, fetch, cancel and respond tools.")
    job: str
    status: Status
    status_message: str | None = None
    created: bool = Field(
        description="False when an earlier start with the same idempotency_key is returned."
    )
    poll_after_ms: int = Field(description="Wait at least this long before checking progress.")
    expires_at: datetime = Field(description="When the job and its result are deleted.")
    input_requests: dict[str, InputRequestView] = Field(
        default_factory=dict,
        description="Questions the job needs answered before it starts, by key (answer with the respond tool).",
    )
    next: str = Field(description="What to do next.")


class ProgressOutput(FlatSchemaModel):
    job: str
    status: Status
    status_message: str | None = None
    progress: ProgressView
    input_requests: dict[str, InputRequestView] = Field(
        default_factory=dict,
        description="Questions waiting for an answer, by key (answer with the respond tool).",
    )
    attempts: int = Field(
        0, description="How many times the job has been started (more than 1 after a retry)."
    )
    steps: list[StepView] = Field(
        default_factory=list, description="The job's durable steps so far (names and outcomes, not values)."
    )
    created_at: datetime
    updated_at: datetime
    expires_at: datetime
    poll_after_ms: int | None = Field(None, description="When to check again; null once the job has ended.")
    next: str


class CancelOutput(FlatSchemaModel):
    job: str
    status: Status
    status_message: str | None = None
    cancel_requested: bool
    next: str


class RespondOutput(FlatSchemaModel):
    job: str
    status: Status
    accepted: list[str] = Field(description="Keys whose answers were recorded.")
    ignored: list[str] = Field(
        description="Keys that were unknown or already answered; nothing was changed for them."
    )
    input_requests: dict[str, InputRequestView] = Field(default_factory=dict)
    next: str


class FetchOutputBase(FlatSchemaModel):
    job: str
    status: Status
    status_message: str | None = None
    error: ErrorView | None = Field(None, description="Why the job failed, when it failed.")
    tool_error: str | None = Field(
        None, description="The job's own error message, when it ended in a tool error."
    )
    result_link: ResultLink | None = Field(None, description="The result, when too large to show here.")
    poll_after_ms: int | None = None
    expires_at: datetime
    next: str


def fetch_model(name: str, result_type: Any, description: str) -> type[FetchOutputBase]:
    """A fetch tool's output model: `FetchOutputBase` and its `result`, of `result_type`."""
    return create_model(
        name, __base__=FetchOutputBase, result=(result_type, Field(None, description=description))
    )


@dataclass(frozen=True)
class ToolReply:
    """A tool's answer: structured content (conforming to the output model) or a caller error."""

    structured: dict[str, Any]
    is_error: bool = False
    link: ResultLink | None = None
    """A large result's link, also given as a `resource_link` content item."""

    @functools.cached_property
    def text(self) -> str:
        """The structured content as JSON text (made once: a progress reply may be reused, `ReplyMemo`)."""
        return json.dumps(self.structured, ensure_ascii=False, default=str)


ToolHandler = Callable[[str, dict[str, Any]], Awaitable[ToolReply]]


@dataclass(frozen=True)
class ToolDefinition:
    name: str
    title: str
    description: str
    input_model: type[BaseModel]
    output_model: type[BaseModel]
    handler: ToolHandler
    read_only: bool
    destructive: bool = False
    idempotent: bool = True


def input_views(pending: list[InputRequestRecord]) -> dict[str, InputRequestView]:
    """The questions waiting for an answer, by key, as a reply shows them."""
    return {r.key: InputRequestView(message=r.message, requested_schema=r.requested_schema) for r in pending}


def error_reply(error: CallerError) -> ToolReply:
    return ToolReply(structured=error.to_dict(), is_error=True)


def guarded(handler: ToolHandler) -> ToolHandler:
    """The handler, answering a caller's mistake (`CallerError`) as an error reply instead of raising it."""

    async def answer(principal: str, arguments: dict[str, Any]) -> ToolReply:
        try:
            return await handler(principal, arguments)
        except CallerError as error:
            return error_reply(error)

    return answer


def to_call_tool_result(reply: ToolReply) -> CallToolResult:
    """Structured content plus the same JSON as text; caller errors carry text only."""
    content: list[ContentBlock] = [TextContent(type="text", text=reply.text)]
    if reply.is_error and "error" in reply.structured and "status" not in reply.structured:
        return CallToolResult(content=content, is_error=True)
    if reply.link is not None:
        content.append(resource_link(reply.link))
    return CallToolResult(content=content, structured_content=reply.structured, is_error=reply.is_error)


def refusal(error: CallerError) -> CallToolResult:
    """A caller error as the tool result every generated tool answers it with."""
    return to_call_tool_result(error_reply(error))
