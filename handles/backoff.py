"""How long to wait before trying again: doubling pauses with a cap and a little jitter."""

from __future__ import annotations

import random

BACKOFF_FIRST_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 8.0


def backoff_seconds(
    failures: int,
    jitter: float = 0.2,
    *,
    first: float = BACKOFF_FIRST_SECONDS,
    most: float = BACKOFF_MAX_SECONDS,
) -> float:
    """The pause after `failures` failures in a row: `first` doubling up to `most`, plus up to `jitter` of it."""
    base: float = min(most, first * 2.0 ** max(0, failures - 1))
    return base * (1 + max(0.0, jitter) * random.random())
