"""Change notices sent after their writes commit, many at once: PostgreSQL serialises notifying commits."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger("handles.store")

LINGER_SECONDS = 0.005
"""The least time between two sends of one node: a notice goes out at once after a quiet spell, and within
this long while notices begin to come."""
MAX_LINGER_SECONDS = 0.02
"""While notices keep coming, the time between sends doubles up to this, so a busy node commits fewer
notifying transactions; a quiet spell longer than the current linger sets it back to `LINGER_SECONDS`."""


class NoticeSender:
    """Sends the notices queued with `add`, all pending at once, on a thread of its own."""

    def __init__(self, send: Callable[[list[str]], None]) -> None:
        self._send = send
        self._pending: dict[str, None] = {}  # in the order queued, each once
        self._ready = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def add(self, notice: str) -> None:
        """Queue `notice`, of a change that has committed."""
        with self._ready:
            self._pending[notice] = None
            if self._thread is None:
                self._closed = False
                self._thread = threading.Thread(target=self._run, name="handles-notices", daemon=True)
                self._thread.start()
            self._ready.notify()

    def close(self) -> None:
        """Send the notices still pending, then end the thread."""
        with self._ready:
            self._closed = True
            self._ready.notify()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        sent = 0.0  # when the last send began (`time.monotonic`)
        linger = LINGER_SECONDS
        while True:
            with self._ready:
                self._ready.wait_for(lambda: bool(self._pending) or self._closed)
                if not self._pending:
                    self._thread = None
                    return
                closed = self._closed
            now = time.monotonic()
            linger = LINGER_SECONDS if now - sent >= linger else min(linger * 2, MAX_LINGER_SECONDS)
            if not closed and (wait := sent + linger - now) > 0:
                time.sleep(wait)
            with self._ready:
                batch, self._pending = list(self._pending), {}
            sent = time.monotonic()
            try:
                self._send(batch)
            except Exception as exc:  # the changes are stored: waiters elsewhere find them at their next poll
                logger.warning("could not send %d change notice(s): %s", len(batch), exc)
