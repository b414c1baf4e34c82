"""One retry formula for clients, a starting node and crashed `retry` jobs (handles.backoff)."""

from __future__ import annotations

import pytest

from handles.backoff import backoff_seconds


@pytest.mark.parametrize(
    ("failures", "expected"), [(0, 0.5), (1, 0.5), (2, 1.0), (3, 2.0), (5, 8.0), (40, 8.0)]
)
def test_the_pause_doubles_from_half_a_second_to_eight(failures: int, expected: float) -> None:
    assert backoff_seconds(failures, jitter=0) == expected


def test_jitter_adds_at_most_its_share_and_never_shortens_the_pause() -> None:
    pauses = [backoff_seconds(3, jitter=0.2) for _ in range(500)]
    assert all(2.0 <= pause <= 2.4 for pause in pauses)
    assert len(set(pauses)) > 1


def test_first_and_most_set_the_scale() -> None:
    assert [backoff_seconds(n, jitter=0, first=1, most=60) for n in (1, 2, 6, 7, 30)] == [1, 2, 32, 60, 60]
