"""Waiting for a condition with a bounded deadline, instead of a fixed sleep that a loaded machine outruns."""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio


async def until(
    condition: Callable[[], bool], what: str, *, within: float = 20.0, every: float = 0.02
) -> None:
    """Return once `condition()` holds; fail with `what` when it still does not after `within` seconds."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within:g} s")
        await anyio.sleep(every)
