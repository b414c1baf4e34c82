"""The job status enum and the one transition table every status change goes through."""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """Where a job stands. The values are the wire values of the Tasks extension."""

    WORKING = "working"
    INPUT_REQUIRED = "input_required"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL


TERMINAL: frozenset[Status] = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED})
ACTIVE: frozenset[Status] = frozenset({Status.WORKING, Status.INPUT_REQUIRED})

# The only edges a stored status may follow (progress and leases never change the status).
TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.WORKING: frozenset({Status.INPUT_REQUIRED, *TERMINAL}),
    Status.INPUT_REQUIRED: frozenset({Status.WORKING, *TERMINAL}),
    Status.COMPLETED: frozenset(),
    Status.FAILED: frozenset(),
    Status.CANCELLED: frozenset(),
}


def can_transition(source: Status, target: Status) -> bool:
    """Whether a job in `source` may move to `target`."""
    return target in TRANSITIONS[source]


def sources_of(target: Status) -> frozenset[Status]:
    """Every status from which `target` may be reached: the guard of a compare-and-set update."""
    return frozenset(source for source, targets in TRANSITIONS.items() if target in targets)
