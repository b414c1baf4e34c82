"""A node's shutdown: stop taking work, let running jobs finish for `drain_seconds`, hand the rest over."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from handles.runtime.dispatch import JobDispatch
from handles.runtime.run_life import RunLife

logger = logging.getLogger("handles.runtime")


class ShutdownDrain(JobDispatch):
    """The part of `Runtime` that drains it on shutdown."""

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
        """Drain: stop claiming, let running jobs finish for `drain_seconds`, then hand the rest over.

        A running `retry` job is released for any node; any other ends `failed` (or `cancelled` when a
        cancel was asked). Parked jobs are untouched.
        """
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
