"""The heartbeat: keeps this node's leases alive (while jobs run and while their outcome is written)
and hears about cancels requested elsewhere and jobs that ended elsewhere."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from handles.config import HandlesConfig
from handles.errors import StoreUnavailable
from handles.store import Store

logger = logging.getLogger("handles.runtime")


async def every(
    wake: Callable[[], asyncio.Event], interval: float, once: Callable[[], Awaitable[object]], what: str
) -> None:
    """Run `once()` each time `wake()` is set, or every `interval` seconds; log its failures and go on."""
    while True:
        event = wake()
        with contextlib.suppress(TimeoutError):
            # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancel that lands as the
            # event is set, and stopping would wait for this loop forever.
            async with asyncio.timeout(interval):
                await event.wait()
        event.clear()
        try:
            await once()
        except StoreUnavailable:  # an outage, not a bug: one line, no traceback
            logger.warning("%s failed: the database is unavailable; retrying", what)
        except Exception:
            logger.exception("%s failed; retrying", what)


class LeaseKeeper:
    def __init__(
        self,
        *,
        store: Store,
        owner: str,
        config: HandlesConfig,
        held: Callable[[], list[str]],
        on_cancel: Callable[[str], object],
        on_lost: Callable[[str], None],
    ) -> None:
        self.store = store
        self.owner = owner
        self.config = config
        self._held = held
        self._on_cancel = on_cancel
        self._on_lost = on_lost
        self.wake = asyncio.Event()

    @property
    def interval(self) -> float:
        return self.config.heartbeat_interval

    async def run(self) -> None:
        await every(lambda: self.wake, self.interval, self.beat, "heartbeat")

    async def beat(self) -> None:
        ids = self._held()
        if not ids:
            return
        cancelled, lost = await self.store.call(
            self.store.repo.heartbeat, self.owner, ids, self.config.lease_seconds
        )
        for job_id in cancelled:
            self._on_cancel(job_id)
        for job_id in lost:
            self._on_lost(job_id)
