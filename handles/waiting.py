"""Waiting for a stored job to change; between two reads it always awaits, so no caller spins on reads."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from typing import TypeVar

from handles.errors import StoreUnavailable
from handles.states import Status
from handles.store import JobRecord, JobState, Store

Opened = TypeVar("Opened", JobRecord, JobState)
"""A job read whole, or its state alone (`JobRepository.snapshot`)."""


async def job_versions(
    store: Store,
    record: Opened,
    *,
    draining: Callable[[], bool],
    seconds: float | None = None,
    past_reports: bool = False,
    reread_seconds: float = 60.0,
    outage_pause: float | None = None,
) -> AsyncGenerator[Opened | JobRecord]:
    """`record`, then each newer version of its job as it is stored here or on any other node.

    Ends after a terminal version, when the job is gone, after `seconds`, or once the node drains.
    `outage_pause`: a store outage pauses the reads that long instead of raising `StoreUnavailable`.
    """
    yield record
    loop = asyncio.get_running_loop()
    deadline = None if seconds is None else loop.time() + seconds
    notifier, job_id = store.notifier, record.id
    last: Opened | JobRecord = record

    def left() -> float:
        """Seconds until the next re-read is due; 0 once the wait is over."""
        if Status(last.status).is_terminal or draining():
            return 0.0
        return reread_seconds if deadline is None else min(reread_seconds, deadline - loop.time())

    # Draining is checked after each read, not before: the answer a drain cuts short is the latest state.
    while not Status(last.status).is_terminal and (deadline is None or loop.time() < deadline):
        # Watch, then read: a change landing after the read still ends the wait below at once.
        changed = notifier.watch(job_id, past_reports=past_reports)
        try:
            latest = await store.read(store.repo.get, job_id)
        except StoreUnavailable:
            if outage_pause is None:
                raise
            if draining():
                return
            await asyncio.sleep(outage_pause)
            continue
        if latest is None:
            return
        if latest.version != last.version:
            last = latest
            yield latest
        timeout = left()
        if timeout <= 0:
            return
        notifier.seen(job_id, last.version)
        if changed.is_set():
            await asyncio.sleep(0)  # changed since the read: read it again, after one turn of the loop
        else:
            await notifier.wait(job_id, timeout, event=changed)
