"""What the parts of the runtime share, and how a job goes back to the queue."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping
from typing import Any

from handles.config import HandlesConfig
from handles.errors import StoreUnavailable
from handles.jobs import JobSpec
from handles.runtime.leases import LeaseKeeper
from handles.runtime.run_life import RunningJob
from handles.runtime.slots import Slots
from handles.runtime.sweeper import Sweeper
from handles.sealing import Sealer
from handles.store import Store
from handles.telemetry import Telemetry

logger = logging.getLogger("handles.runtime")


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
    _loops: list[asyncio.Task[None]]
    _dispatcher: asyncio.Task[None] | None
    _background: set[asyncio.Task[Any]]
    _wake: asyncio.Event
    _backlog: bool
    _leases: LeaseKeeper
    _sweeper: Sweeper
    _started: bool
    _draining: bool
    _closed: bool
    _drain_deadline: float | None
    _drain_cut: asyncio.Event

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

    async def _hand_back(self, job_id: str) -> None:
        repo = self.store.repo
        message = "Queued: its server is shutting down; another server starts it shortly."
        await self.store.write(
            job_id, "queued", repo.release, job_id, self.owner, message=message, resuming=True
        )

    async def _requeued(self, job_id: str) -> None:
        self._backlog = True
        self._wake.set()
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
