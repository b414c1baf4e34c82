"""What the runtime's parts share: where each run stands, their state, and a job's way back to the queue."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeVar

from handles.config import HandlesConfig
from handles.errors import StoreUnavailable
from handles.jobs import JobContext, JobSpec
from handles.outcomes import Outcome
from handles.runtime.leases import LeaseKeeper
from handles.runtime.slots import Slots
from handles.sealing import Sealer
from handles.store import Change, Store
from handles.telemetry import Telemetry

logger = logging.getLogger("handles.runtime")

T = TypeVar("T")


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


class RuntimeState:
    """The state every part of `Runtime` reads and writes (set up by `Runtime.__init__`)."""

    store: Store
    sealer: Sealer
    telemetry: Telemetry
    config: HandlesConfig
    specs: Mapping[str, JobSpec]
    owner: str
    slots: Slots
    _running: dict[str, RunningJob]
    _background: set[asyncio.Task[Any]]
    _wake: asyncio.Event
    _backlog: bool
    _leases: LeaseKeeper
    started: bool
    _draining: bool
    _closed: bool

    @property
    def closed(self) -> bool:
        """True once the runtime began to drain or stopped: it takes no new work and never restarts."""
        return self._draining or self._closed

    def running_ids(self) -> list[str]:
        return list(self._running)

    def _spawn(self, coroutine: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run a short background task that `stop` waits for."""
        task = asyncio.create_task(coroutine, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_log_task_failure)
        return task

    async def _settle_background(self) -> None:
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    async def _write_held(
        self, job_id: str, change: Change, method: Callable[..., T], *args: Any, **kwargs: Any
    ) -> T:
        """`method(job_id, owner, *args, **kwargs)` on the store, as the node holding the job's lease."""
        return await self.store.write(job_id, change, method, job_id, self.owner, *args, **kwargs)

    async def _hand_back(self, job_id: str) -> None:
        message = "Queued: its server is shutting down; another server starts it shortly."
        await self._write_held(job_id, "queued", self.store.repo.release, message=message, resuming=True)

    def submit(self) -> None:
        """A job was just stored or became claimable: let the dispatcher take it, fairly, if a slot is free."""
        if not self.config.run_workers or self.closed:
            return
        self._backlog = True
        self._wake.set()

    async def _requeued(self, job_id: str) -> None:
        self.submit()
        await self.store.announce(job_id)


def _log_task_failure(task: asyncio.Task[Any]) -> None:
    if task.cancelled() or task.exception() is None:
        return
    error = task.exception()
    if isinstance(error, StoreUnavailable):  # an outage, not a bug: one line, no traceback
        logger.warning(
            "%s: the database is unavailable, nothing was written; leases and the sweep settle it later",
            task.get_name(),
        )
        return
    logger.error("background task failed", exc_info=error)
