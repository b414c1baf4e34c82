"""The heartbeat: keeps this node's leases alive and hears of cancels and endings elsewhere."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from handles.config import HandlesConfig
from handles.errors import StoreUnavailable
from handles.store import Store

logger = logging.getLogger("handles.runtime")

OUTAGE_PATIENCE_SECONDS = 10.0
"""How long, at least, a run's write of what it knows waits out a database outage (`writable_until`)."""


async def every(
    wake: Callable[[], asyncio.Event], interval: float, once: Callable[[], Awaitable[object]], what: str
) -> None:
    """Run `once()` each time `wake()` is set, or every `interval` seconds; log its failures and go on."""
    while True:
        event = wake()
        with contextlib.suppress(TimeoutError):
            # Not wait_for: on 3.11 it swallows a cancel that lands as the event is set.
            async with asyncio.timeout(interval):
                await event.wait()
        event.clear()
        try:
            await once()
        except StoreUnavailable:  # an outage, not a bug: one line, no traceback
            logger.warning("%s failed: the database is unavailable; retrying", what)
        except Exception:
            logger.exception("%s failed; retrying", what)


@dataclass(kw_only=True, eq=False)
class LeaseKeeper:
    """Renews this node's leases, and from each renewal says how long a write may wait out an outage."""

    store: Store
    owner: str
    config: HandlesConfig
    held: Callable[[], list[str]]
    on_cancel: Callable[[str], object]
    on_lost: Callable[[str], None]
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    # job id -> the loop time its lease was last set from (its claim, a heartbeat that renewed it)
    _renewed: dict[str, float] = field(default_factory=dict, init=False)

    async def run(self) -> None:
        await every(lambda: self.wake, self.config.heartbeat_interval, self.beat, "heartbeat")

    def leased(self, job_id: str) -> None:
        """This node has just claimed `job_id`: its lease runs from about now."""
        self._renewed[job_id] = asyncio.get_running_loop().time()

    def writable_until(self, job_id: str) -> float | None:
        """Until when (loop time) a write of what this node's run of `job_id` knows may wait out an outage; None without a lease."""
        renewed = self._renewed.get(job_id)
        if renewed is None:
            return None
        return renewed + max(2 * self.config.lease_seconds, OUTAGE_PATIENCE_SECONDS)

    async def beat(self) -> None:
        ids = self.held()
        held = set(ids)
        self._renewed = {job_id: at for job_id, at in self._renewed.items() if job_id in held}
        if not ids:
            return
        began = asyncio.get_running_loop().time()  # the renewed leases run from no earlier than this
        cancelled, lost = await self.store.call(
            self.store.repo.heartbeat, self.owner, ids, self.config.lease_seconds
        )
        for job_id in held - lost:
            self._renewed[job_id] = max(self._renewed.get(job_id, began), began)
        for job_id in cancelled:
            self.on_cancel(job_id)
        for job_id in lost:
            self.on_lost(job_id)
