"""`_detached` builds the same model from a stored row as `model_construct`, past the ORM's attribute events."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.orm import configure_mappers

from handles.store.models import InputRequestRecord, JobRecord, StepRecord, _column_values, _detached

NOW = datetime(2026, 12, 1, 20, 0, tzinfo=UTC)


def rows() -> list[tuple[type[Any], dict[str, Any]]]:
    configure_mappers()
    job = JobRecord.model_construct(
        id="j1", kind="work", principal="local:local", principal_key="k", status="working",
        status_message="Running.", arguments={"seconds": 1}, arguments_digest="d", idempotency_key=None,
        result=None, error={"code": 1}, progress_done=1.5, progress_total=None, attempts=1, resuming=False,
        version=3, created_at=NOW, updated_at=NOW, started_at=NOW, finished_at=None,
        expires_at=NOW + timedelta(hours=1), run_after=NOW, lease_owner="node", lease_expires_at=NOW,
        claim_log="[1]\n", cancel_requested_at=None, trace_context=None, cancel_requested_by=None,
        input_deadline=None, abandon_at=None, on_interrupt="fail", max_attempts=1, keep_result_seconds=None,
        input_timeout_seconds=None, abandon_after_seconds=None,
    )  # fmt: skip
    question = InputRequestRecord(
        job_id="j1", key="q1", message="ok?", requested_schema={"type": "object"}, created_at=NOW
    )
    step = StepRecord(job_id="j1", name="s", status="started", attempt=1, started_at=NOW)
    return [
        (JobRecord, _column_values(JobRecord.__table__, job)),  # type: ignore[attr-defined]
        (InputRequestRecord, _column_values(InputRequestRecord.__table__, question)),  # type: ignore[attr-defined]
        (StepRecord, {c.name: getattr(step, c.name) for c in StepRecord.__table__.columns}),  # type: ignore[attr-defined]
    ]


@pytest.mark.parametrize("index", [0, 1, 2], ids=["job", "question", "step"])
def test_a_full_row_gives_the_model_model_construct_gives(index: int) -> None:
    model, row = rows()[index]
    assert set(row) == set(model.model_fields), "a full row: every column"
    built, constructed = _detached(model, row), model.model_construct(**row)
    assert type(built) is model
    assert built == constructed
    assert built.model_dump() == constructed.model_dump() == row
    assert built.__pydantic_fields_set__ == constructed.__pydantic_fields_set__
    for name, value in row.items():
        assert getattr(built, name) == value, name
    copied = built.model_copy(update={"version": 99} if model is JobRecord else {})
    assert copied == constructed.model_copy(update={"version": 99} if model is JobRecord else {})


def test_a_row_without_every_column_gets_model_construct_defaults() -> None:
    _, row = rows()[0]
    partial = {key: value for key, value in row.items() if key != "arguments"}
    built = _detached(JobRecord, partial)
    assert built.arguments == {} and built.status == "working"
