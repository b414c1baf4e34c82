"""A job's options: their defaults, how two of them resolve, and the error each bad value gets."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from handles.ask_first import AskFirst
from handles.errors import ConfigurationError
from handles.jobs import DEFAULT_POLL_AFTER, DEFAULT_RETENTION, JobContext, JobSpec
from handles.limits import MAX_RESULT_BYTES


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
