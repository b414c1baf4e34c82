"""The handle tools' flat output schemas accept and refuse exactly what pydantic's own schemas do."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from enum import Enum
from typing import Any, Optional

import pytest
from jsonschema.validators import validator_for
from mcp.server.mcpserver.utilities.func_metadata import StrictJsonSchema
from pydantic import BaseModel, Field, TypeAdapter, create_model

from handles.server.output_schema import FlatSchemaModel
from handles.server.tool_shapes import (
    CancelOutput,
    FetchOutputBase,
    ProgressOutput,
    RespondOutput,
    StartOutput,
)


class Color(Enum):
    RED = "red"
    BLUE = "blue"


class Node(BaseModel):
    """A recursive result type: its reference to itself cannot be inlined."""

    name: str
    children: list[Node] = []


class Report(BaseModel):
    title: str
    color: Optional[Color] = None  # noqa: UP045 - nullable enum: keeps its anyOf
    pages: int | None = Field(None, ge=1)
    tree: Node | None = None


FetchOutput = create_model("report_fetch_output", __base__=FetchOutputBase, result=(Optional[Report], None))  # noqa: UP045


def schemas(model: type[BaseModel]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pydantic's own schema of the model, the flat one the SDK publishes), as the SDK derives them."""
    flat = TypeAdapter(model).json_schema(schema_generator=StrictJsonSchema)
    fields: dict[str, Any] = {name: (field.annotation, field) for name, field in model.model_fields.items()}
    plain = create_model(f"{model.__name__}Plain", **fields)
    own = TypeAdapter(plain).json_schema(schema_generator=StrictJsonSchema)
    return own, flat


def accepts(schema: dict[str, Any], document: Any) -> bool:
    return bool(validator_for(schema)(schema).is_valid(document))


NOW = datetime(2026, 12, 1, tzinfo=UTC).isoformat()
PROGRESS = {
    "job": "work", "status": "working", "status_message": None,
    "progress": {"done": 1, "total": None, "fraction": None}, "input_requests": {}, "attempts": 1,
    "steps": [{"name": "s", "status": "completed", "attempt": 1, "started_at": NOW, "finished_at": None}],
    "created_at": NOW, "updated_at": NOW, "expires_at": NOW, "poll_after_ms": None, "next": "wait",
}  # fmt: skip
FETCHED = {
    "job": "report", "status": "completed", "expires_at": NOW, "next": "done",
    "result": {"title": "t", "color": None, "pages": 2, "tree": {"name": "a", "children": [{"name": "b"}]}},
}  # fmt: skip
STARTED = {
    "handle": "h", "job": "work", "status": "working", "status_message": "Running.", "created": True,
    "poll_after_ms": 100, "expires_at": NOW, "input_requests": {"q1": {"message": "m", "requested_schema": {}}},
    "next": "follow",
}  # fmt: skip
CANCELLED = {
    "job": "work",
    "status": "cancelled",
    "status_message": None,
    "cancel_requested": True,
    "next": "n",
}
RESPONDED = {
    "job": "work",
    "status": "working",
    "accepted": ["q1"],
    "ignored": [],
    "input_requests": {},
    "next": "n",
}


def variants(document: dict[str, Any]) -> list[Any]:
    """`document`, and documents one change away from it (each field set to values of other types)."""
    found: list[Any] = [document, {}, None, []]
    for key in document:
        values: tuple[Any, ...] = (
            None,
            1,
            1.5,
            "x",
            True,
            [],
            {},
            {"name": 3},
            [{"name": "a"}],
            "red",
            "sleeping",
        )
        for value in values:
            found.append({**document, key: value})
        found.append({k: v for k, v in document.items() if k != key})
    for key in ("progress", "result", "input_requests"):
        inner = document.get(key)
        if isinstance(inner, dict):
            for name in inner:
                changed: tuple[Any, ...] = (
                    None,
                    0,
                    -1,
                    "x",
                    "red",
                    "green",
                    {"name": 1},
                    {"name": "a", "children": [{}]},
                )
                for value in changed:
                    found.append({**document, key: {**inner, name: value}})
    return found


@pytest.mark.parametrize(
    ("model", "document"),
    [
        (ProgressOutput, PROGRESS),
        (FetchOutput, FETCHED),
        (StartOutput, STARTED),
        (CancelOutput, CANCELLED),
        (RespondOutput, RESPONDED),
    ],
    ids=["progress", "fetch", "start", "cancel", "respond"],
)
def test_the_flat_schema_accepts_exactly_what_pydantics_schema_accepts(
    model: type[BaseModel], document: dict[str, Any]
) -> None:
    own, flat = schemas(model)
    assert own != flat, "the published schema is the flat one"
    checked = variants(document)
    for candidate in checked:
        assert accepts(own, candidate) == accepts(flat, candidate), json.dumps(candidate)
    assert accepts(flat, document)
    assert sum(accepts(flat, candidate) for candidate in checked) < len(checked) / 2, "it still refuses"


def test_references_are_inlined_except_a_recursive_models_own() -> None:
    _, progress = schemas(ProgressOutput)
    assert "$ref" not in json.dumps(progress) and "$defs" not in progress
    assert progress["properties"]["status_message"]["type"] == ["string", "null"]
    assert progress["properties"]["steps"]["items"]["properties"]["finished_at"]["type"] == ["string", "null"]
    _, fetched = schemas(FetchOutput)
    assert set(fetched["$defs"]) == {"Node"}, "only the recursive model stays a definition"
    report = fetched["properties"]["result"]
    assert report["type"] == ["object", "null"]
    assert "anyOf" in report["properties"]["color"], (
        "a nullable enum keeps its anyOf (null is not in the enum)"
    )
    assert report["properties"]["pages"] == {
        "default": None,
        "minimum": 1,
        "title": "Pages",
        "type": ["integer", "null"],
    }
    assert report["properties"]["tree"]["properties"]["children"]["items"] == {"$ref": "#/$defs/Node"}


def test_the_handle_tools_output_models_are_flat() -> None:
    for model in (StartOutput, ProgressOutput, CancelOutput, RespondOutput, FetchOutputBase):
        assert issubclass(model, FlatSchemaModel), model
