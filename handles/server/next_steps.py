"""What each handle tool's reply tells the caller to do next (`next`), from the job's state, and what a
progress reply says of a running job whose node has gone quiet (its lease not renewed)."""

from __future__ import annotations

import functools
import json
from datetime import UTC, datetime

from handles.jobs import JobSpec
from handles.liveness import LeaseTiming, NodeContact, clock_time, node_contact
from handles.states import Status
from handles.store import InputRequestRecord, JobRecord, JobState
from handles.tool_layout import ToolNames


class JobGuidance:
    """The names of one job's tools and the `next` sentences of their replies."""

    def __init__(self, spec: JobSpec, names: ToolNames, max_wait: float, lease_timing: LeaseTiming) -> None:
        self.spec = spec
        self.names = names
        self.max_wait = max_wait
        self.lease_timing = lease_timing
        self._quiet_margin = lease_timing.quiet_margin
        self.poll_seconds = spec.poll_after_ms / 1000

    def tool(self, verb: str) -> str:
        """The name of this job's `verb` tool in the layout (`<job>_progress` or the shared `jobs_progress`)."""
        return self.names.name(self.spec.name, verb)

    def next_step(
        self, job: JobRecord | JobState, pending: list[InputRequestRecord], *, fetching: bool = False
    ) -> str:
        status = Status(job.status)
        if status is Status.WORKING:
            return self._still_running
        if status is Status.INPUT_REQUIRED:
            keys = ", ".join(r.key for r in pending) or "the pending keys"
            example = json.dumps({r.key: {"...": "..."} for r in pending[:1]} or {"q1": {"...": "..."}})
            return (
                f"The job is waiting for an answer to {keys}. Read input_requests, then call "
                f"{self.tool('respond')} with this handle and responses like {example} (one object per key, "
                f"fields as in its requested_schema); then keep following the job with {self.tool('progress')}."
            )
        if status is Status.COMPLETED:
            until = job.expires_at.isoformat()
            if fetching:
                return f"The job is finished and this is its result. Nothing more to do; it stays available until {until}."
            return f"The job is finished. Call {self.tool('fetch')} with this handle to get the result (kept until {until})."
        if status is Status.FAILED and _reason(job) == "server_configuration":
            return (
                "The job failed because of the server's configuration, not because of your request; see "
                "error. Starting it again fails the same way: tell the server's operator the reference in "
                "error, and start it again once they have fixed it."
            )
        if status is Status.FAILED:
            return (
                "The job failed and will not produce a result; see error. Do not retry blindly: check whether "
                f"anything it started must be reconciled, then start a new job with {self.tool('start')} if needed."
            )
        if _reason(job) == "step_unknown":
            return (
                "The job was cancelled while a step was still running, and that step's outcome is unknown (see "
                "status_message). Reconcile it (check whether its effect happened) before starting a new job "
                f"with {self.tool('start')}."
            )
        return (
            "The job was cancelled and will not produce a result. Start a new job with "
            f"{self.tool('start')} if you still need it."
        )

    @functools.cached_property
    def _still_running(self) -> str:
        """`next_step` of a job still working: the same for every poll of this job kind, so made once."""
        wait_hint = f"set wait_seconds (up to {int(self.max_wait)}) to wait for the change instead of polling"
        return (
            f"The job is still running. Call {self.tool('progress')} with this handle in about "
            f"{self.poll_seconds:g} s ({wait_hint}), or {self.tool('fetch')} with wait_seconds to wait for the result."
        )

    def _quiet_node(self, job: JobState) -> NodeContact | None:
        """What the job's lease tells of its node, once the node has gone quiet (None before: a poll of a
        healthy job pays one comparison)."""
        lease_end, now = job.lease_expires_at, datetime.now(UTC)
        if lease_end is None or now <= lease_end - self._quiet_margin:
            return None
        contact = node_contact(job.status, lease_end, now, self.lease_timing)
        return contact if contact is not None and contact.quiet else None

    def _quiet_status(self, job: JobState, quiet: NodeContact) -> str:
        """The status message of a job whose server has gone quiet: the job's own, then how long and until when
        (never which server: a caller is not told where its job runs)."""
        own = f"{job.status_message} " if job.status_message else ""
        return (
            f"{own}(The server running this job has not been heard from for {quiet.silent_seconds:.0f} s; "
            f"another server takes the job over {_takeover(quiet)}.)"
        )

    def _quiet_next(self, job: JobState, quiet: NodeContact) -> str:
        """`next` for a job whose server has gone quiet: keep following it, do not start it again."""
        then = (
            "runs it again (steps it already recorded are not repeated)"
            if self.spec.on_interrupt == "retry" and job.attempts < self.spec.max_attempts
            else "ends it as failed (this job is not run again after an interruption), and its reply will say so"
        )
        return (
            f"The server running this job has not been heard from for {quiet.silent_seconds:.0f} s (it may have "
            f"stopped). Nothing is lost: another server takes the job over {_takeover(quiet)} and {then}. Do not start a new "
            f"job; keep calling {self.tool('progress')} with this handle in about {self.poll_seconds:g} s (or "
            f"with wait_seconds up to {int(self.max_wait)} to wait for the change)."
        )


def _takeover(quiet: NodeContact) -> str:
    """When another server takes over the job of a quiet one."""
    return "as soon as one is running" if quiet.takeover_overdue else f"by {clock_time(quiet.takeover_by)}"


def _reason(job: JobRecord | JobState) -> str | None:
    """Why a failed (or cancelled) job ended, as its error says (`error.data.reason`)."""
    return None if job.error is None else job.error.get("data", {}).get("reason")
