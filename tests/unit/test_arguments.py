"""`ArgumentRules`: the checks the argument gate runs before the SDK, on a synthesised tool function."""

from __future__ import annotations

import inspect
from typing import Annotated, Any

from pydantic import Field

from handles.server.argument_gate import MAX_NESTING, ArgumentRules, nesting


async def progress(
    handle: str, wait_seconds: Annotated[float, Field(ge=0)] = 0, mcp_context: Any = None
) -> None:
    """A stand-in with the parameters of a `<job>_progress` tool."""


RULES = ArgumentRules.of("demo_progress", progress, "mcp_context")


def deep(levels: int) -> Any:
    value: Any = "leaf"
    for index in range(levels):
        value = {"a": value} if index % 2 else [value]
    return value


def test_nesting_counts_objects_and_arrays_without_recursion() -> None:
    assert nesting("x") == 0 and nesting({}) == 1 and nesting({"a": [1, {"b": []}]}) == 4
    assert nesting(deep(50_000)) == 50_000, "far beyond the interpreter's recursion limit"


def test_valid_arguments_pass_as_the_sdk_would_take_them() -> None:
    assert RULES.check({"handle": "h"}) is None
    assert RULES.check({"handle": "h", "wait_seconds": "2.5"}) is None, "the SDK's JSON pre-parsing applies"
    assert RULES.accepted == ("handle", "wait_seconds")
    assert RULES.usage == "handle (string, required), wait_seconds (number >= 0, optional)"


def test_each_mistake_names_the_argument_what_it_expected_and_the_next_call() -> None:
    for arguments, expected in (
        (
            {"handle": "h", "wait_seconds": -3},
            "wait_seconds: should be greater than or equal to 0 (expected number >= 0)",
        ),
        ({"handle": 123}, "handle: should be a valid string (expected string)"),
        ({}, "handle is required (string) but missing"),
        (
            {"handle": "h", "wiat": 1},
            "demo_progress has no argument named wiat; it accepts handle, wait_seconds",
        ),
        (
            {"handle": "h", "wait_seconds": deep(MAX_NESTING + 1)},
            f"nested {MAX_NESTING + 2} levels deep",
        ),  # with the arguments object
    ):
        error = RULES.check(arguments)
        assert error is not None and error.code == "invalid_arguments", arguments
        assert expected in error.message, error.message
        assert "demo_progress again with handle (string, required)" in error.next_step
        assert "pydantic" not in error.message and "input_value" not in error.message


def test_the_signature_is_the_sdk_view_of_the_function() -> None:
    assert list(inspect.signature(progress).parameters)[-1] == "mcp_context"
    assert "mcp_context" not in RULES.accepted


async def counted(
    months: int, share: float | None = None, flag_or_count: bool | int = 0, mcp_context: Any = None
) -> None:
    """A stand-in with numbers of several shapes, and one that takes a boolean too."""


def test_a_boolean_is_not_a_number() -> None:
    """pydantic's lax mode reads `true` as 1; JSON does not, and neither does the gate."""
    error = RULES.check({"handle": "h", "wait_seconds": True})
    assert error is not None and error.code == "invalid_arguments"
    assert "wait_seconds: should be a valid number, not true (expected number >= 0)" in error.message
    rules = ArgumentRules.of("demo_start", counted, "mcp_context")
    for arguments, expected in (
        ({"months": False}, "months: should be a valid integer, not false (expected integer)"),
        ({"months": 2, "share": True}, "share: should be a valid number, not true (expected number or null)"),
    ):
        error = rules.check(arguments)
        assert error is not None and expected in error.message, (arguments, error and error.message)
    assert rules.check({"months": 2, "share": None, "flag_or_count": True}) is None, (
        "a boolean where one fits"
    )
