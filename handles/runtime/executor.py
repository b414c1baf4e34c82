"""The executor: runs the jobs of one process against a shared store, and drains them on shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Mapping
from typing import Any

from handles.config import HandlesConfig
from handles.jobs import JobSpec
from handles.runtime.dispatch import JobDispatch
from handles.runtime.leases import LeaseKeeper, every
from handles.runtime.slots import Slots
from handles.runtime.state import RunLife, RunningJob
from handles.runtime.sweeper import Sweeper
from handles.sealing import Sealer
from handles.store import Store
from handles.telemetry import Telemetry

logger = logging.getLogger("handles.runtime")


class Runtime(JobDispatch):
    """Runs the jobs of one process against a shared store."""

    def __init__(
        self, *, store: Store, config: HandlesConfig, specs: Mapping[str, JobSpec], sealer: Sealer
    ) -> None:
        self.store = store
        self.sealer = sealer
        self.telemetry = Telemetry()
        self.specs = specs
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._running: dict[str, RunningJob] = {}
        self._loops: list[asyncio.Task[None]] = []
        self._dispatcher: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._wake = asyncio.Event()
        # Whether queued jobs may be waiting; a start is claimed at insert only when nothing waits before it.
        self._backlog = True
        self._leases = LeaseKeeper(
            store=store,
            owner=self.owner,
            config=config,
            held=self.running_ids,
            on_cancel=self.signal_cancel,
            on_lost=self._drop,
        )
        self._sweeper = Sweeper(
            store=store,
            runs_here=lambda job_id: job_id in self._running,
            drop=self._drop,
            signal_cancel=self.signal_cancel,
            requeued=self._requeued,
            evidence_seconds=lambda: self.config.audit_retention_seconds,
            telemetry=self.telemetry,
        )
        self.reconfigure(config)  # its config and slots
        store.origin = self.owner
        store.writable_until = self._leases.writable_until  # what a run knows is written through an outage
        self._started = False
        self._draining = False
        self._closed = False
        self._drain_deadline: float | None = None
        self._drain_cut = asyncio.Event()  # set by `end_drain`: the drain ends now

    def reconfigure(self, config: HandlesConfig) -> None:
        """Take new settings (only before the runtime starts)."""
        self.config = config
        self._leases.config = config
        self.slots = Slots(config.max_running if config.run_workers else 0, config.principal_slot_limit)

    @property
    def started(self) -> bool:
        return self._started

    async def start(self) -> None:
        """Start the background loops on the running event loop (idempotent; never after `stop`)."""
        if self._started or self.closed:
            return
        self._started = True
        self.telemetry.observe(self)
        self._wake = asyncio.Event()
        self._leases.wake = asyncio.Event()
        self._loops = [
            asyncio.create_task(self._sweep_loop(), name="handles-sweeper"),
            asyncio.create_task(
                # never woken early: it runs each store_poll_seconds
                every(asyncio.Event, self.config.store_poll_seconds, self.store.poll_watched, "watch pass"),
                name="handles-watch",
            ),
        ]
        listening = await self.store.change_listener(self._on_remote_change)
        if listening is not None:
            self._loops.append(asyncio.create_task(listening, name="handles-listener"))
        if self.config.run_workers:
            # The first pass runs before any start is taken, so `_backlog` is true from the first start.
            try:
                await self._claim_queued()
            except Exception:
                logger.exception("first dispatcher pass failed; the dispatcher retries")
            self._dispatcher = asyncio.create_task(self._dispatch_loop(), name="handles-dispatcher")
            self._loops.append(asyncio.create_task(self._leases.run(), name="handles-heartbeat"))

    async def _sweep_loop(self) -> None:
        """A sweep at once, then one every `sweep_interval_seconds`."""
        now = asyncio.Event()
        now.set()
        await every(lambda: now, self.config.sweep_interval_seconds, self.sweep_once, "sweep")

    async def sweep_once(self) -> dict[str, int]:
        """One bounded pass over the store (see `handles.runtime.sweeper`)."""
        return await self._sweeper.sweep_once()

    def begin_drain(self) -> None:
        """Stop taking work now and wake every waiter; running jobs go on. Safe from a signal callback."""
        if self._draining:
            return
        self._draining = True
        with contextlib.suppress(RuntimeError):
            loop = asyncio.get_running_loop()
            self._drain_deadline = loop.time() + self.config.drain_seconds
        if self._dispatcher is not None:
            self._dispatcher.cancel()
        self.store.notifier.notify_all()
        if self._running:
            logger.info(
                "draining: %d running job(s) may finish for up to %gs",
                len(self._running),
                self.config.drain_seconds,
            )

    def end_drain(self) -> None:
        """End the drain now: `stop` hands the running jobs over at once. Safe from a signal handler's callback."""
        self.begin_drain()
        if not self._drain_cut.is_set() and self._running:
            logger.info("drain ended early: %d running job(s) are handed over now", len(self._running))
        self._drain_cut.set()

    async def drained(self) -> None:
        """After `begin_drain`: wait until the running jobs have ended or the drain's deadline or `end_drain` came."""
        loop = asyncio.get_running_loop()
        if self._drain_deadline is None:
            self._drain_deadline = loop.time() + self.config.drain_seconds
        waiting = {entry.task for entry in self._running.values() if entry.task is not None}
        if not waiting or self._drain_cut.is_set():
            return
        cut = asyncio.create_task(self._drain_cut.wait(), name="handles-drain-cut")
        try:
            while waiting and not cut.done() and (left := self._drain_deadline - loop.time()) > 0:
                done, _ = await asyncio.wait(
                    waiting | {cut}, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                waiting -= done
        finally:
            cut.cancel()

    async def stop(self) -> None:
        """Stop claiming, let running jobs finish for `drain_seconds`, then hand the rest over by their
        interrupt policy (parked jobs are untouched)."""
        if not self._started:
            self._closed = True
            return
        self.begin_drain()
        loop = asyncio.get_running_loop()
        if self._drain_deadline is None:
            self._drain_deadline = loop.time() + self.config.drain_seconds
        if self._dispatcher is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._dispatcher
        await self._settle_background()
        await self.drained()
        leftover = list(self._running.values())
        for entry in leftover:
            entry.enter(RunLife.STOPPING)
            self._interrupt(entry)
        tasks = [entry.task for entry in leftover if entry.task is not None and not entry.task.done()]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=self.config.step_cancel_limit_seconds + 1.0)
            if late:
                logger.warning(
                    "%d job(s) did not stop in time (a step is still executing); their leases will run out "
                    "and another node settles them",
                    len(late),
                )
        await self._settle_background()
        for loop_task in self._loops:
            loop_task.cancel()
        for loop_task in self._loops:
            with contextlib.suppress(asyncio.CancelledError):
                await loop_task
        self._loops = []
        self._started = False
        self._closed = True
        self.telemetry.forget(self)
