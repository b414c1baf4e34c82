"""The console's login throttle on a clock the test moves: blocks, their end, back-off, bounded memory.

(Over real HTTP, with the 429, `Retry-After` and the log line: tests/console/test_console_edges.py.)
"""

from __future__ import annotations

import logging

import pytest

from handles.console.throttle import (
    BLOCK_SECONDS,
    FAILURES_ALLOWED,
    MAX_BLOCK_SECONDS,
    WINDOW_SECONDS,
    LoginThrottle,
    Throttled,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fail(throttle: LoginThrottle, client: str, times: int = FAILURES_ALLOWED) -> None:
    for _ in range(times):
        throttle.check(client)
        throttle.failed(client)


def wait_of(throttle: LoginThrottle, client: str) -> int | None:
    try:
        throttle.check(client)
    except Throttled as throttled:
        return throttled.retry_after
    return None


def remembered(throttle: LoginThrottle) -> int:
    """How many clients `throttle` keeps a record of."""
    return len(throttle._records)


def test_a_block_ends_and_comes_back_twice_as_long() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock=clock)
    fail(throttle, "a", FAILURES_ALLOWED - 1)
    assert wait_of(throttle, "a") is None
    fail(throttle, "a", 1)
    assert wait_of(throttle, "a") == BLOCK_SECONDS
    clock.now += BLOCK_SECONDS - 0.5
    assert wait_of(throttle, "a") == 1
    clock.now += 0.5
    assert wait_of(throttle, "a") is None, "the block is over"
    fail(throttle, "a")
    assert wait_of(throttle, "a") == 2 * BLOCK_SECONDS, "throttled again while remembered: twice as long"
    blocks = []
    for _ in range(8):
        wait = wait_of(throttle, "a")
        assert wait is not None
        blocks.append(wait)
        clock.now += wait
        fail(throttle, "a")
    assert blocks == [2 * BLOCK_SECONDS * 2**n for n in range(5)] + [MAX_BLOCK_SECONDS] * 3


def test_failures_spread_over_more_than_a_window_never_block() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock=clock)
    for _ in range(3 * FAILURES_ALLOWED):
        fail(throttle, "a", 1)
        clock.now += WINDOW_SECONDS / (FAILURES_ALLOWED - 1) + 1
    assert wait_of(throttle, "a") is None


def test_a_quiet_window_after_a_block_forgets_the_client() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock=clock)
    fail(throttle, "a")
    clock.now += BLOCK_SECONDS + WINDOW_SECONDS + 1
    fail(throttle, "a")
    assert wait_of(throttle, "a") == BLOCK_SECONDS, "back to the first block's length"


def test_the_right_token_clears_a_clients_failures() -> None:
    throttle = LoginThrottle(clock=Clock())
    fail(throttle, "a", FAILURES_ALLOWED - 1)
    throttle.succeeded("a")
    fail(throttle, "a", FAILURES_ALLOWED - 1)
    assert wait_of(throttle, "a") is None and remembered(throttle) == 1


def test_one_warning_per_block_not_per_request(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    throttle = LoginThrottle(clock=clock)
    with caplog.at_level(logging.WARNING, logger="handles"):
        fail(throttle, "a")
        for _ in range(100):
            assert wait_of(throttle, "a") is not None
        clock.now += BLOCK_SECONDS
        fail(throttle, "a")
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2, lines
    assert "a;" in lines[0] and f"for {BLOCK_SECONDS} s" in lines[0]
    assert f"for {2 * BLOCK_SECONDS} s" in lines[1]


def test_many_addresses_never_grow_the_table_past_its_bound() -> None:
    throttle = LoginThrottle(clock=Clock(), max_clients=100)
    for n in range(10_000):
        fail(throttle, f"10.{n // 65536}.{n // 256 % 256}.{n % 256}", 1)
        assert remembered(throttle) <= 100
    fail(throttle, "attacker")
    assert wait_of(throttle, "attacker") == BLOCK_SECONDS, "a client failing now is remembered"
    assert wait_of(throttle, "10.0.0.0") is None, "the least recently failed was forgotten"
