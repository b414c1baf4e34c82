"""Form-elicitation schemas (objects of primitive fields) and the checks of stored answers."""

from __future__ import annotations

import math
from enum import Enum
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

from example_server.server import Approval
from handles.elicitation import SchemaError, elicitation_schema, validate_answer


class Color(Enum):
    RED = "red"
    BLUE = "blue"


class Form(BaseModel):
    name: str = Field(min_length=2, max_length=5)
    age: int = Field(ge=0, le=130)
    ratio: float = 0.5
    agree: bool
    color: Color
    size: Literal["s", "m", "l"] = "m"
    email: str = Field("a@b.c", json_schema_extra={"format": "email"})


def test_pydantic_model_becomes_a_flat_object_schema() -> None:
    schema = elicitation_schema(Form)
    assert schema["type"] == "object"
    assert set(schema) <= {"type", "properties", "required", "title", "description"}
    assert "$defs" not in schema and "title" not in schema
    props = schema["properties"]
    assert props["color"]["enum"] == ["red", "blue"] and "$ref" not in props["color"]
    assert props["size"]["enum"] == ["s", "m", "l"]
    assert props["age"]["type"] == "integer" and props["age"]["minimum"] == 0
    assert set(schema["required"]) == {"name", "age", "agree", "color"}


def test_the_example_approval_question() -> None:
    schema = elicitation_schema(Approval)
    assert schema["properties"]["approve"]["type"] == "boolean"
    assert schema["properties"]["environment"]["enum"] == ["staging", "production"]
    assert set(schema["required"]) == {"approve", "environment"}
    assert validate_answer(schema, {"approve": True, "environment": "staging"}) == []
    assert validate_answer(schema, {"approve": "yes", "environment": "moon"}) == [
        "approve: expected true or false",
        "environment: must be one of ['staging', 'production']",
    ]


def test_a_dict_schema_is_checked_and_trimmed() -> None:
    raw = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
        "$schema": "https://json-schema.org/draft/2020-12/schema",
    }
    assert elicitation_schema(raw) == {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
    }
    assert "additionalProperties" in raw, "the caller's dict is not modified"


class Nested(BaseModel):
    inner: Form


class ListOfStrings(BaseModel):
    tags: list[str]


class MultiSelect(BaseModel):
    colors: list[Literal["red", "green"]]


@pytest.mark.parametrize(
    "schema",
    [
        Nested,
        ListOfStrings,
        {"type": "array", "items": {"type": "string"}},
        {"type": "object"},
        {"type": "object", "properties": {"x": {"type": "object", "properties": {}}}},
        {"type": "object", "properties": {"x": {"type": "null"}}},
        {"type": "object", "properties": {"x": "string"}},
        {"type": "object", "properties": {"x": {"type": "integer", "format": "email"}}},
        {"type": "object", "properties": {"x": {"type": "string", "format": "ipv4"}}},
        {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["y"]},
        {"type": "object", "properties": {"x": {"type": "string"}}, "required": "x"},
        "not a schema",
    ],
)
def test_schemas_form_elicitation_cannot_carry_are_refused(schema: Any) -> None:
    with pytest.raises(SchemaError):
        elicitation_schema(schema)


def test_multi_select_enums_and_one_of_titles_are_allowed() -> None:
    schema = elicitation_schema(MultiSelect)
    assert schema["properties"]["colors"]["type"] == "array"
    titled = {
        "type": "object",
        "properties": {"plan": {"type": "string", "oneOf": [{"const": "a", "title": "A"}, {"const": "b"}]}},
    }
    assert elicitation_schema(titled)["properties"]["plan"]["oneOf"][0]["const"] == "a"
    assert validate_answer(titled, {"plan": "b"}) == []
    assert validate_answer(titled, {"plan": "c"}) == ["plan: must be one of ['a', 'b']"]
    assert validate_answer(schema, {"colors": ["red", "green"]}) == []
    assert validate_answer(schema, {"colors": ["red", "blue"]}) == [
        "colors: not among the choices ['red', 'green']: ['blue']"
    ]
    assert validate_answer(schema, {"colors": "red"}) == ["colors: expected a list of choices"]


FORM = elicitation_schema(Form)
GOOD = {"name": "Ann", "age": 30, "agree": False, "color": "red"}


def test_a_fitting_answer_has_no_problems() -> None:
    assert validate_answer(FORM, GOOD) == []
    assert validate_answer(FORM, {**GOOD, "ratio": 2, "size": "l", "email": "x@y.z"}) == []


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"name": None}, "name: expected a string"),
        ({"name": "A"}, "name: must be at least 2 characters"),
        ({"name": "Annabel"}, "name: must be at most 5 characters"),
        ({"age": -1}, "age: must be at least 0"),
        ({"age": 131}, "age: must be at most 130"),
        ({"age": 1.5}, "age: expected an integer"),
        ({"age": True}, "age: expected an integer"),
        ({"age": "30"}, "age: expected an integer"),
        ({"ratio": math.nan}, "ratio: expected a number"),
        ({"ratio": math.inf}, "ratio: expected a number"),
        ({"agree": 1}, "agree: expected true or false"),
        ({"color": "green"}, "color: must be one of ['red', 'blue']"),
        ({"email": "nobody"}, "email: expected an email address"),
        (
            {"extra": 1},
            "extra: not a field of this question (fields: name, age, ratio, agree, color, size, email)",
        ),
    ],
)
def test_each_problem_is_named(change: dict[str, Any], problem: str) -> None:
    assert validate_answer(FORM, {**GOOD, **change}) == [problem]


def test_missing_required_fields_and_non_objects() -> None:
    assert validate_answer(FORM, {"name": "Ann"}) == ["age: required", "agree: required", "color: required"]
    assert validate_answer(FORM, ["Ann"]) == ["the answer must be a JSON object of field values"]
    assert validate_answer(FORM, None) == ["the answer must be a JSON object of field values"]


@pytest.mark.parametrize(
    ("fmt", "good", "bad", "problem"),
    [
        ("date", "2026-07-28", "28/07/2026", "expected an ISO date"),
        ("date-time", "2026-07-28T10:00:00+00:00", "tomorrow", "expected an ISO date-time"),
        ("uri", "https://example.com", "example", "expected a URI"),
        ("email", "a@b", "@b", "expected an email address"),
    ],
)
def test_string_formats(fmt: str, good: str, bad: str, problem: str) -> None:
    schema = elicitation_schema({"type": "object", "properties": {"v": {"type": "string", "format": fmt}}})
    assert validate_answer(schema, {"v": good}) == []
    assert validate_answer(schema, {"v": bad}) == [f"v: {problem}"]


class Bounded(BaseModel):
    n: int = Field(gt=0, lt=10, multiple_of=2)
    tags: list[Literal["a", "b"]] = Field(min_length=1, max_length=2)
    code: str = Field(pattern="^[A-Z]+$")


def test_every_constraint_the_schema_carries_is_checked() -> None:
    schema = elicitation_schema(Bounded)
    assert validate_answer(schema, {"n": 4, "tags": ["a"], "code": "AB"}) == []
    assert validate_answer(schema, {"n": 0, "tags": [], "code": "x"}) == [
        "n: must be greater than 0",
        "tags: choose at least 1 of the choices",
        "code: must match the regular expression ^[A-Z]+$",
    ]
    assert validate_answer(schema, {"n": 10, "tags": ["a", "b", "a"], "code": "A"}) == [
        "n: must be less than 10",
        "tags: choose at most 2 of the choices",
    ]
    assert validate_answer(schema, {"n": 3, "tags": ["a"], "code": "A"}) == ["n: must be a multiple of 2"]
    assert validate_answer({"properties": {"k": {"type": "integer", "enum": [1, 2]}}}, {"k": True}) == [
        "k: must be one of [1, 2]"
    ]
