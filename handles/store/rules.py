"""The rules of a job's lifecycle on every engine: what a move changes, how an interrupted run settles."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from handles.backoff import backoff_seconds
from handles.outcomes import cancelled_message, failed
from handles.states import TERMINAL, Status, can_transition
from handles.store.models import _JOBS, JobRecord, StepRecord, _column_values, principal_key


class ActiveLimitReached(Exception):
    """The principal already has `limit` active jobs; nothing was stored."""

    def __init__(self, active: int, limit: int) -> None:
        super().__init__(f"{active} active jobs (limit {limit})")
        self.active = active
        self.limit = limit


def _own_start(step: StepRecord, own: tuple[int, datetime] | None) -> bool:
    """Whether the stored `step` is the start `own` itself, committed by an earlier try."""
    return own is not None and (step.status, step.attempt, step.started_at) == ("started", *own)


def _starts_again(status: str, repeatable: bool) -> bool:
    """Whether a known step starts afresh: it failed, or it is repeatable and did not complete."""
    return status == "failed" or (repeatable and status != "completed")


def _interrupted_outcome(job: JobRecord, now: datetime, *, shutdown: bool) -> tuple[Status, dict[str, Any]]:
    """The status and fields that settle an interrupted job; `now` by the lease clock."""
    attempts = job.attempts
    if job.cancel_requested_at is not None:
        return Status.CANCELLED, {
            "status_message": _cancelled(job, "; its process stopped before it finished")
        }
    if job.on_interrupt == "retry" and shutdown:
        return Status.WORKING, {
            "status_message": "Its server is shutting down; another server continues it now.",
            "run_after": now,
            "resuming": True,
        }
    if job.on_interrupt == "retry" and attempts < job.max_attempts:
        delay = backoff_seconds(attempts, jitter=0, first=1, most=60)  # 1 s doubling to a minute
        return Status.WORKING, {
            "status_message": f"Interrupted during attempt {attempts}; retrying as attempt {attempts + 1} of "
            f"{job.max_attempts}.",
            "run_after": now + timedelta(seconds=delay),
        }
    cause = (
        "its server shut down before it finished and this job cannot be resumed"
        if shutdown
        else "the server process running it stopped before it finished"
        + (f" (after {attempts} attempts)" if attempts > 1 else "")
    )
    message = (
        f"The job was interrupted: {cause}. Its outcome is unknown; reconcile any external effects before "
        "starting it again."
    )
    return failed(message, "shutdown" if shutdown else "interrupted", attempts=attempts)


def _cancelled(job: JobRecord, when: str) -> str:
    """The status message of `job` cancelled `when`, saying who asked."""
    return cancelled_message(job.cancel_requested_by, job.principal, when)


def _waiting_as(job: JobRecord) -> str:
    """At what point a job no worker holds is: before its first run, parked on a question, or between runs."""
    if job.started_at is None:
        return " before it started"
    if Status(job.status) is Status.INPUT_REQUIRED:
        return " while it waited for an answer"
    return " while it waited to run again"


def _job_values(job: JobRecord) -> dict[str, Any]:
    """The row of a new job `job`, its columns by name, with its principal's key."""
    values = _column_values(_JOBS, job)
    values["principal_key"] = values["principal_key"] or principal_key(values["principal"])
    return values


def _may_transition(job: Any, target: Status, owner: str | None, lease_expired_by: datetime | None) -> bool:
    """Whether `transition` may move this job to `target` (edge, owner, lease run out)."""
    if not can_transition(Status(job.status), target):
        return False
    if owner is not None and job.lease_owner != owner:
        return False
    return lease_expired_by is None or (
        job.lease_expires_at is not None and job.lease_expires_at < lease_expired_by
    )


_LEASE = ("lease_owner", "lease_expires_at")
_CLEARED_ON_ENTERING: dict[Status, tuple[str, ...]] = {
    Status.WORKING: ("input_deadline",),
    Status.INPUT_REQUIRED: (),
    **{status: (*_LEASE, "input_deadline", "abandon_at") for status in TERMINAL},
}
"""What entering each status empties: an ended job holds no lease and no deadline; an answered one waits for
no answer. Both `_transitioned` and `_transition_statement` are built from it."""


def _transitioned(job: Any, target: Status, now: datetime, values: Mapping[str, Any]) -> None:
    """Move a job (a model or a row's values) to `target` with what entering it changes."""
    source = Status(job.status)
    if not can_transition(source, target):
        raise ValueError(f"a job may not move from {source} to {target}")
    job.status = target.value
    for name in _CLEARED_ON_ENTERING[target]:
        setattr(job, name, None)
    if target in TERMINAL:
        job.finished_at = now
        if job.keep_result_seconds is not None:
            job.expires_at = min(job.expires_at, now + timedelta(seconds=job.keep_result_seconds))
    _changed(job, now, values)


def _changed(job: Any, now: datetime, values: Mapping[str, Any]) -> None:
    """Set `values` on a job and count the change (its `version`, which wakes long-polls)."""
    for name, value in values.items():
        setattr(job, name, value)
    _touch(job, now)


def _set_values(values: Mapping[str, Any], columns: Sequence[str]) -> dict[str, Any]:
    return {f"set_{name}": values[name] for name in columns}


def _touch(job: Any, now: datetime) -> None:
    job.updated_at = now
    job.version += 1
