"""What a progress reply says of a running job whose node has gone quiet (its lease not renewed)."""

from __future__ import annotations

from datetime import UTC, datetime

from handles.jobs import JobSpec
from handles.liveness import LeaseTiming, NodeContact, clock_time, node_contact
from handles.server.next_steps import JobGuidance
from handles.store import JobState
from handles.tool_layout import ToolNames


class QuietNodeGuidance(JobGuidance):
    """A job's guidance, with the wording of a reply about a job whose node has gone quiet."""

    def __init__(self, spec: JobSpec, names: ToolNames, max_wait: float, lease_timing: LeaseTiming) -> None:
        super().__init__(spec, names, max_wait)
        self.lease_timing = lease_timing
        self._quiet_margin = lease_timing.quiet_margin

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
        takeover = (
            "another server takes the job over as soon as one is running"
            if quiet.takeover_overdue
            else f"another server takes the job over by {clock_time(quiet.takeover_by)}"
        )
        return (
            f"{own}(The server running this job has not been heard from for {quiet.silent_seconds:.0f} s; "
            f"{takeover}.)"
        )

    def _quiet_next(self, job: JobState, quiet: NodeContact) -> str:
        """`next` for a job whose server has gone quiet: keep following it, do not start it again."""
        when = (
            "as soon as one is running" if quiet.takeover_overdue else f"by {clock_time(quiet.takeover_by)}"
        )
        then = (
            "runs it again (steps it already recorded are not repeated)"
            if self.spec.on_interrupt == "retry" and job.attempts < self.spec.max_attempts
            else "ends it as failed (this job is not run again after an interruption), and its reply will say so"
        )
        return (
            f"The server running this job has not been heard from for {quiet.silent_seconds:.0f} s (it may have "
            f"stopped). Nothing is lost: another server takes the job over {when} and {then}. Do not start a new "
            f"job; keep calling {self.tool('progress')} with this handle in about {self._poll_seconds:g} s (or "
            f"with wait_seconds up to {int(self.max_wait)} to wait for the change)."
        )
