"""The operator's switches, kept in the store: stop the Tasks face from creating tasks, or pause new
starts of a job kind."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime

from handles.config import HandlesConfig
from handles.store import Store, SwitchRecord

logger = logging.getLogger("handles.switches")

TASKS = "tasks"
"""The name of the Tasks face's kill switch."""
PAUSED_PREFIX = "paused:"
DEFAULT_RETRY_AFTER_SECONDS = 60.0
"""What a paused job's refusal tells callers to wait when the pause does not say."""


def paused_switch(job: str) -> str:
    """The name of the switch that pauses new starts of `job`."""
    return PAUSED_PREFIX + job


@dataclass(frozen=True)
class Switch:
    """An engaged switch: who engaged it and when (None for a configuration pin), and why."""

    name: str
    changed_by: str
    changed_at: datetime | None
    reason: str | None = None
    retry_after_seconds: float = DEFAULT_RETRY_AFTER_SECONDS
    pinned: bool = False

    @classmethod
    def of(cls, row: SwitchRecord) -> Switch:
        retry = row.retry_after_seconds
        return cls(
            name=row.name,
            changed_by=row.changed_by,
            changed_at=row.changed_at,
            reason=row.reason,
            retry_after_seconds=DEFAULT_RETRY_AFTER_SECONDS if retry is None else retry,
        )

    def describe(self) -> str:
        """`by alice at 2026-12-01 10:00:00 UTC: reason`, or `(pinned by ...)` naming the setting."""
        if self.pinned:
            return f"(pinned by this node's configuration: {self.changed_by})"
        when = "" if self.changed_at is None else f" at {self.changed_at:%Y-%m-%d %H:%M:%S} UTC"
        return f"by {self.changed_by}{when}" + (f": {self.reason}" if self.reason else "")


@dataclass(frozen=True)
class Switches:
    """The engaged switches at one moment: the Tasks face's, and the paused job kinds by name."""

    tasks_off: Switch | None = None
    paused: Mapping[str, Switch] = field(default_factory=dict)

    @classmethod
    def of(cls, rows: Iterable[SwitchRecord], config: HandlesConfig | None = None) -> Switches:
        """The switches engaged in the store, plus those `config` pins (a pin wins over the store's row)."""
        engaged = {row.name: Switch.of(row) for row in rows if row.engaged}
        if config is not None and config.tasks_off:
            engaged[TASKS] = Switch(TASKS, "HANDLES_TASKS_OFF", None, pinned=True)
        for job in config.paused_jobs if config is not None else ():
            engaged[paused_switch(job)] = Switch(paused_switch(job), "HANDLES_PAUSED_JOBS", None, pinned=True)
        return cls(
            tasks_off=engaged.get(TASKS),
            paused={
                name.removeprefix(PAUSED_PREFIX): switch
                for name, switch in engaged.items()
                if name.startswith(PAUSED_PREFIX)
            },
        )

    def lines(self) -> list[str]:
        """One sentence per engaged switch, for operators (logs, `handles jobs list`)."""
        lines = []
        if self.tasks_off is not None:
            lines.append(f"Tasks face: no new tasks, kill switch on {self.tasks_off.describe()}")
        lines += [
            f"{job}: new starts paused {switch.describe()}" for job, switch in sorted(self.paused.items())
        ]
        return lines


@dataclass(eq=False)
class SwitchBoard:
    """One node's copy of the switches, read from the store at most once per `switch_cache_seconds`."""

    store: Store
    config: HandlesConfig
    _: KW_ONLY
    monotonic: Callable[[], float] = time.monotonic
    _current: Switches | None = field(default=None, init=False)
    _read_at: float = field(default=0.0, init=False)
    _lock: asyncio.Lock | None = field(default=None, init=False)

    def _fresh(self) -> Switches | None:
        if self._current is None or self.monotonic() - self._read_at >= self.config.switch_cache_seconds:
            return None
        return self._current

    async def current(self) -> Switches:
        """The switches as this node knows them: at most `switch_cache_seconds` old."""
        fresh = self._fresh()
        if fresh is not None:
            return fresh
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            fresh = self._fresh()
            if fresh is not None:
                return fresh
            read_at = self.monotonic()
            switches = Switches.of(await self.store.read(self.store.repo.switches), self.config)
            self._log_changes(self._current, switches)
            self._current, self._read_at = switches, read_at
            return switches

    def invalidate(self) -> None:
        """Read the store again on the next call (this process just changed a switch)."""
        self._current = None

    def _log_changes(self, before: Switches | None, after: Switches) -> None:
        """One line per switch this node sees engaged or released, so an operator can tell each node took it."""
        old = {} if before is None else _by_name(before)
        new = _by_name(after)
        for name, switch in new.items():
            if old.get(name) != switch:
                logger.info(
                    "operator switch %s engaged %s; this node now applies it", name, switch.describe()
                )
        for name in old.keys() - new.keys():
            logger.info("operator switch %s released; this node no longer applies it", name)


def _by_name(switches: Switches) -> dict[str, Switch]:
    named = {switch.name: switch for switch in switches.paused.values()}
    if switches.tasks_off is not None:
        named[TASKS] = switches.tasks_off
    return named
