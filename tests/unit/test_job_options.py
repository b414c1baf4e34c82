"""A job's options: their defaults, how two of them resolve, and the error each bad value gets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from handles import Handles
from handles.ask_first import AskFirst
from handles.errors import ConfigurationError
from handles.jobs import DEFAULT_POLL_AFTER, DEFAULT_RETENTION, JobContext, JobSpec
from handles.limits import MAX_RESULT_BYTES
from handles.server.handle_tools import JobTools
from handles.server.tasks_extension import task_fields
from handles.states import Status
from handles.store import JobRecord
from tests.support import handles_config, new_key


async def count(ctx: JobContext, n: int) -> int:
    """Counts to n."""
    return n


def test_defaults_name_and_description_come_from_the_function() -> None:
    spec = JobSpec.from_function(count)
    assert (spec.name, spec.description, spec.context_param) == ("count", "Counts to n.", "ctx")
    assert (spec.retention, spec.poll_after) == (DEFAULT_RETENTION, DEFAULT_POLL_AFTER)
    assert (spec.asks_input, spec.on_interrupt, spec.max_attempts) == (False, "fail", 1)
    assert spec.keep_result_for is spec.input_timeout is spec.abandon_after is None
    assert spec.ask_first is spec.link_results_over is None


def test_options_are_kept_and_resolved() -> None:
    spec = JobSpec.from_function(
        count,
        name="tally",
        description="Tallies.",
        retention=timedelta(hours=2),
        on_interrupt="retry",
        max_attempts=0,
        ask_first=AskFirst("Sure?", {"type": "object", "properties": {"ok": {"type": "boolean"}}}),
        link_results_over=1000,
    )
    assert (spec.name, spec.description, spec.retention) == ("tally", "Tallies.", timedelta(hours=2))
    assert spec.asks_input  # a question asked first makes a job that asks
    assert spec.max_attempts == 1  # at least one attempt
    assert JobSpec.from_function(count, on_interrupt="retry", max_attempts=5).max_attempts == 5
    assert JobSpec.from_function(count, max_attempts=5).max_attempts == 1  # only "retry" runs again


@pytest.mark.parametrize(
    ("poll_after", "millis"),
    [
        (DEFAULT_POLL_AFTER, 2000),
        (timedelta(milliseconds=250), 250),
        (timedelta(0), 1),
        (timedelta(seconds=-1), 1),
    ],
)
def test_the_poll_hint_is_whole_milliseconds_and_never_zero(poll_after: timedelta, millis: int) -> None:
    assert JobSpec.from_function(count, poll_after=poll_after).poll_after_ms == millis


def test_every_face_gives_the_one_poll_hint(tmp_path: Path) -> None:
    """A job declared with poll_after=0: the handle tools' `next`, and a task's `pollIntervalMs`, say 1 ms."""
    jobs = Handles(handles_config(tmp_path, [new_key()]))
    jobs.job(poll_after=timedelta(0))(count)
    spec = jobs.specs["count"]
    now = datetime.now(UTC)
    running = JobRecord.model_construct(
        status=Status.WORKING.value, created_at=now, updated_at=now, expires_at=now + timedelta(hours=1)
    )
    assert "in about 0.001 s" in JobTools(spec, jobs.service).next_step(running, [])
    assert task_fields(spec, running, "t")["pollIntervalMs"] == spec.poll_after_ms == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"name": "1st"}, "Job name '1st' must start with a letter"),
        ({"retention": timedelta(0)}, "Job 'count': retention must be positive."),
        ({"on_interrupt": "again"}, "Job 'count': on_interrupt must be 'fail' or 'retry'."),
        ({"keep_result_for": timedelta(0)}, "Job 'count': keep_result_for must be positive (or None)."),
        ({"input_timeout": timedelta(seconds=-1)}, "Job 'count': input_timeout must be positive (or None)."),
        ({"abandon_after": timedelta(0)}, "Job 'count': abandon_after must be positive (or None)."),
        ({"ask_first": AskFirst("Sure?", {"type": "array"})}, "Job 'count': ask_first: "),
        (
            {"link_results_over": MAX_RESULT_BYTES + 1},
            f"Job 'count': link_results_over must be between 1 and {MAX_RESULT_BYTES} bytes (or None).",
        ),
    ],
)
def test_a_bad_option_says_which_and_why(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        JobSpec.from_function(count, **options)
    assert str(raised.value).startswith(message)
