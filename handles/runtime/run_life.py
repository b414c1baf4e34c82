"""Where a run of this process stands (`RunLife`), and what the runtime keeps of each (`RunningJob`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from handles.jobs import JobContext, JobSpec
from handles.outcomes import Outcome


class RunLife(Enum):
    """Where a run of this process stands; it only moves forward, in the order written here."""

    RUNNING = "running"
    STOPPING = "stopping"
    """Interrupted by this node's shutdown: the job is handed over by its interrupt policy."""
    LOST = "lost"
    """It ended elsewhere (or was recovered) while it ran here: nothing it writes is taken."""
    SETTLING = "settling"
    """Its outcome (or its parking) is being written: nothing interrupts it any more."""


@dataclass
class RunningJob:
    spec: JobSpec
    ctx: JobContext
    task: asyncio.Task[None] | None = None
    life: RunLife = RunLife.RUNNING
    timers: list[asyncio.TimerHandle] = field(default_factory=list)
    # What the run replays (answers by key, steps by name) when known without reading the store.
    replay: tuple[dict[str, dict[str, Any]], dict[str, Any]] | None = None
    # Started by a request of this process, whose reply is on its way out: the run lets it go first.
    reply_first: bool = False
    # A plain call of this process waiting for the result: the stored outcome is set on it once committed.
    settled: asyncio.Future[Outcome] | None = None

    def enter(self, life: RunLife) -> bool:
        """Move the run forward to `life` (it never goes back); whether it did."""
        lives = list(RunLife)
        if lives.index(life) <= lives.index(self.life):
            return False
        self.life = life
        return True
