"""What a reader can tell of a running job's node from the job's lease, assuming a shared `HANDLES_LEASE_SECONDS`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from handles.config import HandlesConfig
from handles.states import ACTIVE, Status

QUIET_BEATS = 2
"""A node that missed this many renewals in a row (and a second more, for a slow beat) has gone quiet."""


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """The deployment's lease settings a reader needs: lease length, renewal interval and sweep interval."""

    lease_seconds: float
    heartbeat_interval: float
    sweep_seconds: float

    @classmethod
    def of(cls, config: HandlesConfig) -> LeaseTiming:
        return cls(config.lease_seconds, config.heartbeat_interval, config.sweep_interval_seconds)

    @property
    def quiet_after(self) -> float:
        """How long a node may go unheard before its jobs count as on a quiet node."""
        return QUIET_BEATS * self.heartbeat_interval + 1.0

    @property
    def quiet_margin(self) -> timedelta:
        """How long before its lease's expiry a job's node counts as quiet: a reader on a hot path compares
        `now` with the expiry less this, and asks `node_contact` only past it."""
        return timedelta(seconds=self.lease_seconds - self.quiet_after)


@dataclass(frozen=True, slots=True)
class NodeContact:
    """A running job's node as its lease tells it: when it was last heard from, whether it is quiet, and the takeover time."""

    last_heard_at: datetime
    silent_seconds: float
    quiet: bool
    takeover_by: datetime
    takeover_overdue: bool

    def as_dict(self) -> dict[str, object]:
        """The contact as JSON values (times in ISO 8601), for the `handles` command and the console."""
        return {
            "last_heard_at": self.last_heard_at.isoformat(),
            "silent_seconds": round(self.silent_seconds, 1),
            "quiet": self.quiet,
            "takeover_by": self.takeover_by.isoformat(),
            "summary": contact_text(self),
        }


def node_contact(
    status: str, lease_expires_at: datetime | None, now: datetime, timing: LeaseTiming
) -> NodeContact | None:
    """What the lease of a job tells of its node at `now`; None when no node holds the job."""
    if lease_expires_at is None or Status(status) not in ACTIVE:
        return None
    last_heard = min(lease_expires_at - timedelta(seconds=timing.lease_seconds), now)
    silent = (now - last_heard).total_seconds()
    takeover_by = lease_expires_at + timedelta(seconds=timing.sweep_seconds)
    return NodeContact(last_heard, silent, silent > timing.quiet_after, takeover_by, now > takeover_by)


def clock_time(moment: datetime) -> str:
    """`20:41:07 UTC`: a time within the next minutes, said briefly."""
    return moment.strftime("%H:%M:%S UTC")


def contact_text(contact: NodeContact) -> str:
    """The operator's line: `heard 1 s ago`, or, for a quiet node, how long and when another takes over."""
    if not contact.quiet:
        return f"heard {contact.silent_seconds:.0f} s ago"
    if contact.takeover_overdue:
        return (
            f"quiet {contact.silent_seconds:.0f} s; takeover was due {clock_time(contact.takeover_by)} "
            "(at the next sweep of a running node)"
        )
    return (
        f"quiet {contact.silent_seconds:.0f} s; another node takes over by {clock_time(contact.takeover_by)}"
    )
