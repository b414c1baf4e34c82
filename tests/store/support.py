"""What the store's tests share besides fixtures: a clock the test moves by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class MovableClock:
    """A clock the test moves by hand (leases and retention without sleeping)."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC).replace(microsecond=0)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
