"""The follow tools (`progress`, `fetch`, `cancel`, `respond`) of one job or of the compact layout."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field, create_model

from handles.server.tool_shapes import (
    CancelOutput,
    ProgressOutput,
    RespondOutput,
    ToolDefinition,
    ToolHandler,
    guarded,
)
from handles.tool_layout import ToolNames

HANDLE_DESCRIPTION = "The handle string returned by the start tool, exactly as given."


@dataclass(frozen=True)
class FollowScope:
    """Whose handles a set of follow tools takes, in the words their names and descriptions use."""

    names: ToolNames
    job: str
    label: str
    subject: str
    started: str
    running: str
    expiry: str
    kept: str
    max_wait: float

    def tool(self, verb: str) -> str:
        return self.names.name(self.job, verb)


def follow_definitions(
    scope: FollowScope,
    handlers: Mapping[str, ToolHandler],
    fetch_model: type[BaseModel],
    *,
    asks_input: bool,
) -> list[ToolDefinition]:
    """The progress, fetch, cancel (and respond) tools of one job, or the shared ones of every job."""
    wait_field = (
        float,
        Field(
            0,
            ge=0,
            description=(
                f"Seconds to wait for a change before answering (0 answers at once; at most "
                f"{int(scope.max_wait)}). Waiting is cheaper than polling often."
            ),
        ),
    )
    tool = scope.tool

    def define(
        verb: str, title: str, description: str, output: type[BaseModel], **options: Any
    ) -> ToolDefinition:
        fields = options.pop("fields", {"wait_seconds": wait_field})
        return ToolDefinition(
            name=tool(verb),
            title=title,
            description=description,
            input_model=create_model(
                f"{tool(verb)}_input", handle=(str, Field(description=HANDLE_DESCRIPTION)), **fields
            ),
            output_model=output,
            handler=guarded(handlers[verb]),
            **options,
        )

    defs = [
        define(
            "progress",
            f"{scope.label} progress",
            f"Status and progress of {scope.subject} {scope.started}: "
            "working, input_required, completed, failed or cancelled, with any questions waiting "
            f"for an answer. {scope.expiry}",
            ProgressOutput,
            read_only=True,
        ),
        define(
            "fetch",
            f"{scope.label} result",
            f"The result of {scope.subject} {scope.started}, once completed. "
            "Before that it reports the status and never invents a result; with wait_seconds it "
            f"waits for the job to finish. {scope.kept}",
            fetch_model,
            read_only=True,
        ),
        define(
            "cancel",
            f"Cancel {scope.label}",
            f"Ask {scope.running} to stop. Safe to repeat; cancelling a finished job changes "
            "nothing and reports its final status.",
            CancelOutput,
            read_only=False,
            destructive=True,
            fields={},
        ),
    ]
    if asks_input:
        responses_field = (
            dict[str, dict[str, Any]],
            Field(description='Answers by question key, e.g. {"q1": {"approve": true}}.'),
        )
        defs.append(
            define(
                "respond",
                f"Answer {scope.label}",
                f"Answer the questions {scope.subject} is waiting on (status input_required). "
                "responses maps each question key from input_requests to an object of the requested "
                "fields. Keys already answered, and unknown keys beside an answer, are ignored; a reply "
                "that answers no question the job asked is refused, naming the open ones. The fields "
                f"of each question are its requested_schema, in input_requests of the {tool('progress')} reply; an answer "
                "is checked against it, and one of the wrong shape is refused (saying what was "
                "expected) with nothing stored.",
                RespondOutput,
                read_only=False,
                fields={"responses": responses_field},
            )
        )
    return defs
