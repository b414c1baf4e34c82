"""Deadlines by the database's clock: two nodes whose clocks are minutes apart agree on when queued work is due
and when a job is past its TTL, input or abandonment deadline, as they agree on leases (PostgreSQL)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from handles.states import Status
from handles.store import InputRequestRecord, JobRecord, JobRepository
from handles.store.models import utc_now
from tests.harness.postgres import fresh_schema
from tests.runtime.support import job_row
from tests.support import get_input

SKEW = timedelta(seconds=90)
KINDS = ["k"]


def _node(url: str, skew: timedelta) -> JobRepository:
    """A repository whose node clock is `skew` off the real time, judging leases by the database's clock."""

    def clock() -> datetime:
        return utc_now() + skew

    repo = JobRepository(url, clock=clock, lease_clock="database")
    repo.read_database_clock()  # as the node's sweeper does each pass
    return repo


@pytest.fixture
def nodes(postgres_url: str) -> Iterator[tuple[JobRepository, JobRepository]]:
    """(ahead, behind): two nodes on one database, their clocks `SKEW` ahead of and behind the real time."""
    with fresh_schema(postgres_url.split("?")[0], "handles_clocks") as url:
        ahead, behind = _node(url, SKEW), _node(url, -SKEW)
        ahead.prepare(auto_migrate=True)
        try:
            yield ahead, behind
        finally:
            ahead.dispose()
            behind.dispose()


def _start(repo: JobRepository, **fields: Any) -> JobRecord:
    """A queued job stored by `repo`'s node, its times by that node's clock (as a start sets them)."""
    now = repo.clock()
    values: dict[str, Any] = {"created_at": now, "updated_at": now, "run_after": now}
    values["expires_at"] = now + timedelta(hours=1)
    stored, created = repo.insert(job_row(f"c-{secrets.token_hex(6)}", **(values | fields)))
    assert created
    return stored


def _claimed(repo: JobRepository, owner: str, lease_seconds: float = 30) -> list[str]:
    return [job.id for job in repo.claim_next(owner, KINDS, 10, lease_seconds)]


def test_work_queued_by_a_node_ahead_is_claimed_at_once_by_a_node_behind(
    nodes: tuple[JobRepository, JobRepository],
) -> None:
    ahead, behind = nodes
    job = _start(ahead)
    assert _claimed(behind, "behind") == [job.id], "a start of the node ahead is due at once"

    handed = _start(ahead)
    assert _claimed(ahead, "ahead") == [handed.id]
    assert ahead.release(handed.id, "ahead", message="handed over", resuming=True)
    assert _claimed(behind, "behind") == [handed.id], "a hand-over of the node ahead is due at once"

    asked = _start(ahead)
    assert _claimed(ahead, "ahead") == [asked.id]
    assert ahead.open_input(asked.id, "ahead", "q1", "Which?", {"type": "object"}) is None
    assert ahead.park(asked.id, "ahead") is Status.INPUT_REQUIRED
    outcome = ahead.answer_inputs(asked.id, {"q1": {"pick": 1}})
    assert outcome is not None and outcome.accepted == ["q1"]
    assert _claimed(behind, "behind") == [asked.id], "an answered job is due at once"


def test_a_retrys_delay_set_by_a_node_behind_holds_on_a_node_ahead(
    nodes: tuple[JobRepository, JobRepository],
) -> None:
    ahead, behind = nodes
    job = _start(ahead, on_interrupt="retry", max_attempts=3)
    assert _claimed(ahead, "ahead", lease_seconds=0.1) == [job.id]
    time.sleep(0.3)  # the lease runs out: its node died
    assert behind.settle_interrupted(job.id, "ahead", shutdown=False, lease_expired=True) is Status.WORKING
    assert _claimed(ahead, "ahead") == [], "its retry waits out its backoff (1 s) on every node"
    time.sleep(1.2)
    assert _claimed(ahead, "ahead") == [job.id]


def test_deadlines_set_by_a_node_ahead_are_due_on_a_node_behind(
    nodes: tuple[JobRepository, JobRepository],
) -> None:
    ahead, behind = nodes
    ttl = _start(ahead, expires_at=ahead.clock() + timedelta(seconds=1))
    asked = _start(ahead, input_timeout_seconds=1)
    abandoned = _start(ahead, abandon_after_seconds=1)
    assert sorted(_claimed(ahead, "ahead")) == sorted([ttl.id, asked.id, abandoned.id])
    assert ahead.open_input(asked.id, "ahead", "q1", "Which?", {"type": "object"}) is None
    ahead.touch_abandon_deadline(abandoned.id)
    time.sleep(1.3)
    overdue = behind.overdue(10)
    assert [job.id for job in overdue["ttl"]] == [ttl.id]
    assert [job.id for job in overdue["input"]] == [asked.id]
    assert [job.id for job in overdue["abandoned"]] == [abandoned.id]
    assert isinstance(get_input(behind, asked.id, "q1"), InputRequestRecord)
