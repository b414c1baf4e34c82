"""Slowing down whoever guesses the console's operator token: per-client failure counts, in bounded memory."""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

FAILURES_ALLOWED = 5
WINDOW_SECONDS = 300
BLOCK_SECONDS = 60
MAX_BLOCK_SECONDS = 3600
MAX_CLIENTS = 10_000

logger = logging.getLogger("handles")


@dataclass(slots=True)
class _Record:
    """One client's recent failures: how many since `since` (the window's start), and its blocks."""

    failures: int
    since: float
    blocked_until: float = 0.0
    blocks: int = 0

    def stale(self, now: float) -> bool:
        """Nothing for a window: no failure since the window began, no block that ended within one."""
        return now - max(self.since, self.blocked_until) > WINDOW_SECONDS


class Throttled(Exception):
    """The client sent too many wrong tokens; it may try again in `retry_after` seconds."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"too many wrong operator tokens; try again in {retry_after} s")
        self.retry_after = retry_after


@dataclass(kw_only=True, eq=False)
class LoginThrottle:
    """Counts wrong tokens per client and says when a client must wait (see the module's docstring)."""

    max_clients: int = MAX_CLIENTS
    clock: Callable[[], float] = time.monotonic
    _records: OrderedDict[str, _Record] = field(default_factory=OrderedDict, init=False)

    def check(self, client: str) -> None:
        """Raise `Throttled` while `client` must wait; its token is then not to be checked."""
        record = self._records.get(client)
        if record is None:
            return
        now = self.clock()
        if now < record.blocked_until:
            raise Throttled(max(1, math.ceil(record.blocked_until - now)))

    def failed(self, client: str) -> None:
        """Count a wrong token from `client`; the one that uses up its allowance starts a block."""
        now = self.clock()
        record = self._records.pop(client, None)
        if record is None or record.stale(now):
            record = _Record(failures=0, since=now)
        elif now - record.since > WINDOW_SECONDS:
            record.failures, record.since = 0, now  # a new window; earlier blocks still count
        record.failures += 1
        if record.failures >= FAILURES_ALLOWED:
            seconds = min(BLOCK_SECONDS * 2**record.blocks, MAX_BLOCK_SECONDS)
            record.blocks += 1
            record.failures, record.since, record.blocked_until = 0, now, now + seconds
            logger.warning(
                "console: %d wrong operator tokens from %s; its token checks are refused (429) for %d s",
                FAILURES_ALLOWED,
                client,
                seconds,
            )
        self._records[client] = record  # most recently failed last
        while len(self._records) > self.max_clients:
            self._records.popitem(last=False)

    def succeeded(self, client: str) -> None:
        """The right token from `client`: forget its failures."""
        self._records.pop(client, None)
