"""The `handles check` gates as pytest test cases, against a server by URL or stdio command (docs/checking.md)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from os import PathLike
from pathlib import Path

import anyio

from handles.check import GATES, GateResult, load_plan, run_gates
from handles.check.wire import Server

Principals = Sequence[tuple[str, str | None]]
"""The owner of the jobs, then the other principal: (name, bearer token or None)."""


def gate_results(
    server: Server, principals: Principals, jobs: str | PathLike[str], only: Sequence[str] = ()
) -> list[GateResult]:
    """Each gate's result (those in `only`, else all) against `server`, as `handles check` reports them."""
    selected = list(only or GATES)
    return anyio.run(run_gates, server, list(principals), load_plan(Path(jobs)), selected)


def assert_gates(
    server: Server, principals: Principals, jobs: str | PathLike[str], only: Sequence[str] = ()
) -> None:
    """Raise `AssertionError` with the evidence of every gate that fails."""
    failed = [result for result in gate_results(server, principals, jobs, only) if not result.passed]
    assert not failed, "\n\n".join(f"{result.name}:\n  " + "\n  ".join(result.evidence) for result in failed)


def gate_tests(
    server: Server | Callable[[], Server],
    principals: Principals,
    jobs: str | PathLike[str],
    only: Sequence[str] = (),
) -> Callable[[str], None]:
    """A pytest test function with one case per gate; `server` may be a function that returns it."""
    import pytest  # only a test suite calls this

    @pytest.mark.parametrize("gate", list(only or GATES))
    def test_gate(gate: str) -> None:
        assert_gates(server() if callable(server) else server, principals, jobs, [gate])

    return test_gate
