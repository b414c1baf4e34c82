"""The executor (`Runtime`): takes jobs into this node's slots, runs them, and drains them on shutdown."""

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
from handles.jobs import JobContext, JobSpec
from handles.outcomes import Outcome
from handles.runtime.job_runner import JobRunner
from handles.runtime.job_writes import JobWrites
from handles.runtime.leases import LeaseKeeper, every
from handles.runtime.slots import Slots
from handles.runtime.state import RunLife, RunningJob
from handles.runtime.sweeper import Sweeper
from handles.sealing import Sealer
from handles.store import Change, JobRecord, Store
from handles.store.models import principal_key
from handles.telemetry import Telemetry

logger = logging.getLogger("handles.runtime")


class Runtime(JobRunner):
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
        self.started = False
        self._draining = False
        self._closed = False
        self._drain_deadline: float | None = None
        self._drain_cut = asyncio.Event()  # set by `end_drain`: the drain ends now

    def reconfigure(self, config: HandlesConfig) -> None:
        """Take new settings (only before the runtime starts)."""
        self.config = config
        self._leases.config = config
        self.slots = Slots(config.max_running if config.run_workers else 0, config.principal_slot_limit)

    async def start(self) -> None:
        """Start the background loops on the running event loop (idempotent; never after `stop`)."""
        if self.started or self.closed:
            return
        self.started = True
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
        if not self.started:
            self._closed = True
            return
        self.begin_drain()
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
        self.started = False
        self._closed = True
        self.telemetry.forget(self)

    def reserve(self, kind: str, principal: str) -> bool:
        """Hold a slot for a start stored already claimed by this runtime (see `adopt`)."""
        if self.closed or not self.started or kind not in self.specs or self._backlog:
            return False
        return self.slots.reserve_for(principal_key(principal))

    def queued_message(self, principal: str) -> str:
        """The status message of a start that `reserve` did not run at once: why it waits, truthfully."""
        if self.closed or not self.config.run_workers or not self.started:
            return "Queued; a worker will pick it up shortly."
        if self.slots.free <= 0:
            return "Queued: every worker is busy; it starts as soon as one is free."
        if self.slots.at_share(principal_key(principal)):
            return (
                "Queued: your running jobs hold your share of this server's workers, so other callers' "
                "jobs go first; it starts as soon as none waits or one of yours ends."
            )
        return "Queued; it starts in turn, after the jobs that were waiting before it."

    def adopt(
        self,
        record: JobRecord,
        answers: dict[str, dict[str, Any]],
        *,
        settled: asyncio.Future[Outcome] | None = None,
    ) -> None:
        """Run a job stored already leased here, in the slot `reserve` held; `settled` gets its outcome."""
        if self.closed:
            self.slots.unreserve()
            self._spawn(self._hand_back(record.id), name=f"handles-hand-back-{record.id}")
            return
        self._start_task(record, replay=(answers, {}), reply_first=settled is None, settled=settled)

    def _start_task(
        self,
        record: JobRecord,
        replay: tuple[dict[str, dict[str, Any]], dict[str, Any]] | None = None,
        *,
        reply_first: bool = False,
        settled: asyncio.Future[Outcome] | None = None,
    ) -> None:
        """Run `record` in the slot reserved for it."""
        self.slots.take(record.id, record.principal_key or principal_key(record.principal))
        ctx = JobContext(
            spec=self.specs[record.kind],
            job_id=record.id,
            principal=record.principal,
            attempt=record.attempts,
            writes=JobWrites(self.store, record.id, self.owner),
            progress_flush_seconds=self.config.progress_flush_seconds,
            sealer=self.sealer,
        )
        entry = RunningJob(spec=ctx.spec, ctx=ctx, replay=replay, reply_first=reply_first, settled=settled)
        self._running[record.id] = entry
        self._leases.leased(record.id)
        entry.task = asyncio.create_task(self._execute(entry, record), name=f"handles-job-{ctx.spec.name}")

    async def _dispatch_loop(self) -> None:
        await every(lambda: self._wake, self.config.store_poll_seconds, self._claim_queued, "dispatcher pass")

    async def _claim_queued(self) -> None:
        """One dispatcher pass. Shielded: a drain that stops the dispatcher mid-claim still runs (and then
        drains) what the claim took, instead of leaving it leased to a node that never started it."""
        if self.closed:
            return
        await asyncio.shield(self._spawn(self._claim_into_slots(), name="handles-claim"))

    async def _claim_into_slots(self) -> None:
        if self.slots.free <= 0:
            return
        # Unless work is known to wait, look before reserving: a claim holds every free slot until it returns.
        if not self._backlog and not await self.store.read(self.store.repo.has_claimable, list(self.specs)):
            return
        self._backlog = True  # work waits: a start meanwhile queues behind it, as `reserve` says
        wanted = self.slots.reserve(self.slots.free)
        if wanted <= 0:
            return
        claimed: list[JobRecord] = []
        try:
            claimed = await self.store.call(
                self.store.repo.claim_next,
                self.owner,
                list(self.specs),
                wanted,
                self.config.lease_seconds,
                held=self.slots.held_by_principal(),
                share_limit=self.slots.principal_limit,
                served=self.slots.served(),
            )
        finally:
            self.slots.unreserve(wanted - len(claimed))
        # Fewer than asked for: nothing else waits right now (until a start, a retry or a notice says so).
        self._backlog = len(claimed) >= wanted
        for record in claimed:
            self.store.notifier.notify(record.id)
            self._start_task(record)

    def _on_remote_change(self, job_id: str, change: Change) -> None:
        """Another node changed `job_id`: wake waiters here, look for a cancel if it runs here, for work if it was queued."""
        self.store.notifier.notify(job_id, change)
        if job_id in self._running:
            self._leases.wake.set()
        elif change == "queued" and not self.closed:
            self._backlog = True
            self._wake.set()
