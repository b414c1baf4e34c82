"""What a run's node logs when the outcome it settles with is not stored: that the stored state had moved on
only when it had, and that the database stayed unavailable when the write met an outage that outlasted it."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from handles.errors import StoreUnavailable
from handles.runtime.job_runner import JobRunner
from handles.states import Status


def _runner(written: bool | Exception, ended: list[str]) -> JobRunner:
    """A `JobRunner` as `_settle` sees it: its owner, its telemetry, a store whose write gives `written`."""

    async def write(*args: Any, **kwargs: Any) -> bool:
        if isinstance(written, Exception):
            raise written
        return written

    runner = JobRunner.__new__(JobRunner)
    runner.owner = "node-a"
    runner.store = SimpleNamespace(write=write, repo=SimpleNamespace(transition=None))  # type: ignore[assignment]
    runner.telemetry = SimpleNamespace(  # type: ignore[assignment]
        ended=lambda kind, status, reason: ended.append(status), outcome=None
    )
    return runner


@pytest.mark.parametrize(
    ("written", "said"),
    [
        (True, None),
        (False, "its stored state had already moved on"),
        (StoreUnavailable.now(), "the database stayed unavailable"),
    ],
    ids=["stored", "moved-on", "outage"],
)
async def test_an_outcome_not_stored_is_logged_with_the_reason_it_was_not(
    caplog: pytest.LogCaptureFixture, written: bool | Exception, said: str | None
) -> None:
    caplog.set_level(logging.INFO, logger="handles.runtime")
    ended: list[str] = []
    entry = SimpleNamespace(enter=lambda life: True, ctx=None, settled=None, spec=SimpleNamespace(name="k"))
    await _runner(written, ended)._settle(entry, "job-1", (Status.COMPLETED, {}), None)  # type: ignore[arg-type]
    logged = [record.getMessage() for record in caplog.records if record.name == "handles.runtime"]
    assert ended == ([] if said else ["completed"])
    assert logged == ([] if said is None else [logged[0]]), logged
    assert said is None or (said in logged[0] and "job-1" in logged[0]), logged
