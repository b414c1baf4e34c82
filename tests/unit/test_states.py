"""The status enum and its one transition table (the Tasks extension's statuses and edges)."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path
from types import SimpleNamespace

import pytest

from handles.states import ACTIVE, TERMINAL, TRANSITIONS, Status, can_transition, sources_of
from handles.store import repository, utc_now

W, Q, C, F, X = (
    Status.WORKING,
    Status.INPUT_REQUIRED,
    Status.COMPLETED,
    Status.FAILED,
    Status.CANCELLED,
)

# Written out by hand from the extension's rules, so a change to the table has to change this too.
EXPECTED_EDGES = {
    (W, Q), (W, C), (W, F), (W, X),
    (Q, W), (Q, C), (Q, F), (Q, X),
}  # fmt: skip


def test_wire_values_are_the_extensions() -> None:
    assert [s.value for s in Status] == ["working", "input_required", "completed", "failed", "cancelled"]
    assert Status("input_required") is Q


def test_terminal_and_active_partition_the_statuses() -> None:
    assert {C, F, X} == TERMINAL
    assert {W, Q} == ACTIVE
    assert set(Status) == TERMINAL | ACTIVE
    assert not TERMINAL & ACTIVE
    assert [s for s in Status if s.is_terminal] == [C, F, X]


@pytest.mark.parametrize(("source", "target"), list(itertools.product(Status, Status)))
def test_every_pair_follows_the_table(source: Status, target: Status) -> None:
    assert can_transition(source, target) is ((source, target) in EXPECTED_EDGES)


def test_terminal_statuses_have_no_way_out() -> None:
    for status in TERMINAL:
        assert TRANSITIONS[status] == frozenset()
        assert not any(can_transition(status, target) for target in Status)


def test_no_self_loops() -> None:
    # `working -> working` is absent on purpose: progress changes other columns, never the status.
    assert not any(can_transition(status, status) for status in Status)


@pytest.mark.parametrize("target", list(Status))
def test_sources_of_is_the_inverse_of_the_table(target: Status) -> None:
    assert sources_of(target) == {source for source in Status if can_transition(source, target)}


def test_nothing_leads_back_to_a_terminal_state_from_a_terminal_state() -> None:
    for target in TERMINAL:
        assert sources_of(target) == ACTIVE


def test_every_status_change_the_store_makes_in_python_goes_through_the_table() -> None:
    """The store moves a job's status in one place (`_transitioned`), which refuses an edge the table lacks:
    nothing else in handles/store assigns a job's status."""
    store = Path(repository.__file__).parent
    outside: list[str] = []
    for path in store.rglob("*.py"):
        tree = ast.parse(path.read_text())
        allowed = {
            line
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef) and node.name == "_transitioned"
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1)
        }
        outside += [
            f"{path.name}:{node.lineno}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Attribute)
            and target.attr == "status"
            and isinstance(target.value, ast.Name)
            and target.value.id == "job"
            and node.lineno not in allowed
        ]
    assert not outside, f"a job's status assigned outside _transitioned: {outside}"


def test_a_move_the_table_lacks_is_refused_and_changes_nothing() -> None:
    ended = SimpleNamespace(status="completed", version=1, updated_at=None)
    with pytest.raises(ValueError, match="may not move from completed to working"):
        repository._transitioned(ended, W, utc_now(), {})
    assert (ended.status, ended.version) == ("completed", 1)
