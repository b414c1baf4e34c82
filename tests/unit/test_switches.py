"""A node's copy of the operator's switches: at most one store read per cache period, shared by the calls
arriving together, never older than the bound; configuration pins; the settings that set them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from handles.config import HandlesConfig
from handles.errors import ConfigurationError
from handles.store import JobRepository, Store
from handles.switches import TASKS, SwitchBoard, Switches, paused_switch


class Ticks:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def repo(tmp_path: Path) -> Iterator[JobRepository]:
    repository = JobRepository(f"sqlite:///{tmp_path / 'store.db'}")
    repository.prepare(auto_migrate=True)
    try:
        yield repository
    finally:
        repository.dispose()


def counting(repo: JobRepository) -> list[int]:
    reads = [0]
    original = repo.switches

    def switches() -> list:  # type: ignore[type-arg]
        reads[0] += 1
        return original()

    repo.switches = switches  # type: ignore[method-assign]
    return reads


async def test_the_store_is_read_at_most_once_per_period_and_a_change_shows_within_it(
    repo: JobRepository,
) -> None:
    reads = counting(repo)
    ticks = Ticks()
    board = SwitchBoard(Store.of(repo), HandlesConfig(switch_cache_seconds=2.0), monotonic=ticks)
    first = await asyncio.gather(*(board.current() for _ in range(20)))
    assert reads == [1], "calls arriving together share one read"
    assert all(switches == Switches() for switches in first)

    repo.set_switch(TASKS, engaged=True, by="alice")
    ticks.now += 1.9
    assert (await board.current()).tasks_off is None, "within the period the copy is trusted"
    assert reads == [1]
    ticks.now += 0.1
    now = await board.current()
    assert now.tasks_off is not None and now.tasks_off.changed_by == "alice", "never older than the bound"
    assert reads == [2]


async def test_a_zero_period_reads_the_store_on_every_call(repo: JobRepository) -> None:
    reads = counting(repo)
    board = SwitchBoard(Store.of(repo), HandlesConfig(switch_cache_seconds=0), monotonic=Ticks())
    for _ in range(3):
        await board.current()
    assert reads == [3]


async def test_configuration_pins_hold_whatever_the_store_says(repo: JobRepository) -> None:
    repo.set_switch(TASKS, engaged=False, by="bob")
    repo.set_switch(paused_switch("report"), engaged=True, by="carol", retry_after_seconds=30)
    config = HandlesConfig(tasks_off=True, paused_jobs=("export",))
    switches = await SwitchBoard(Store.of(repo), config).current()
    assert switches.tasks_off is not None and switches.tasks_off.pinned
    assert sorted(switches.paused) == ["export", "report"]
    assert switches.paused["export"].pinned and switches.paused["export"].retry_after_seconds == 60
    assert switches.paused["report"].retry_after_seconds == 30
    assert switches.lines() == [
        "Tasks face: no new tasks, kill switch on (pinned by this node's configuration: HANDLES_TASKS_OFF)",
        "export: new starts paused (pinned by this node's configuration: HANDLES_PAUSED_JOBS)",
        f"report: new starts paused by carol at {switches.paused['report'].changed_at:%Y-%m-%d %H:%M:%S} UTC",
    ]


def test_the_settings_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HANDLES_SWITCH_CACHE_SECONDS", "0.5")
    monkeypatch.setenv("HANDLES_TASKS_OFF", "yes")
    monkeypatch.setenv("HANDLES_PAUSED_JOBS", " export_dataset, ,generate_report ")
    config = HandlesConfig.from_env()
    assert config.switch_cache_seconds == 0.5 and config.tasks_off
    assert config.paused_jobs == ("export_dataset", "generate_report")
    monkeypatch.setenv("HANDLES_SWITCH_CACHE_SECONDS", "600")
    with pytest.raises(ConfigurationError, match="HANDLES_SWITCH_CACHE_SECONDS='600' is not valid"):
        HandlesConfig.from_env()
