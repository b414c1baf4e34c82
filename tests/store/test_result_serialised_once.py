"""A job's result is serialised once (issue 14): the compact JSON text that sizes it against
`link_results_over` is the text the store writes, on an SQLite file and on PostgreSQL. SQLAlchemy's own
serialisation would write `json.dumps`' spaced separators, so the stored text shows which one was written;
read back, the result is the job's, whole."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import text

from handles import Handles, JobContext
from handles.limits import SizedJSON, json_size, sized_json, stored_json
from tests.durability.harness import config
from tests.harness.database import own_connection
from tests.runtime.support import job_id_of, settled, start_as


class Report(BaseModel):
    title: str
    scores: list[float]
    notes: dict[str, str]


REPORT = Report(
    title="Zürich \u2014 \u2603 quarterly",  # non-ASCII text, escaped in ASCII-only JSON
    scores=[1.5, -2.0, 3e-7],
    notes={"a": "line\nbreak", "quote": '"quoted"'},
)


def _stored_text(url: str, job_id: str) -> str:
    """The result column as the database holds it, read by an engine of the test's own."""
    with own_connection(url) as connection:
        return str(
            connection.execute(
                text("SELECT CAST(result AS TEXT) FROM handles_jobs WHERE id = :id"), {"id": job_id}
            ).scalar_one()
        )


async def test_the_result_stored_is_the_text_it_was_sized_by(database_url: str, tmp_path: Path) -> None:
    jobs = Handles(config(tmp_path, database_url=database_url, auto_migrate=True))

    @jobs.job
    async def report(ctx: JobContext) -> Report:
        return REPORT

    async with jobs.running():
        handle = await start_as(jobs, "alice", "report")
        record = await settled(jobs, handle)
        assert record.status == "completed"
        stored = _stored_text(database_url, job_id_of(handle))

    assert record.result is not None
    assert json.loads(stored) == record.result
    assert stored == json.dumps(record.result, separators=(",", ":")), "the compact text it was sized by"
    assert stored != json.dumps(record.result)  # what a second serialisation, SQLAlchemy's, writes
    assert record.result["structuredContent"] == REPORT.model_dump(mode="json")
    assert len(stored) == json_size(json.loads(stored))


@pytest.mark.parametrize(
    "value",
    [{}, {"content": [{"type": "text", "text": "Zürich \u2603"}], "isError": False}, {"n": [1, 2.5, None]}],
)
def test_a_sized_object_is_its_text(value: dict[str, Any]) -> None:
    sized = sized_json(value)
    assert isinstance(sized, SizedJSON) and sized == value
    assert json.loads(sized.text) == value
    assert json_size(sized) == json_size(dict(value)) == len(sized.text.encode())
    assert stored_json(sized) == sized.text
    assert stored_json(dict(value)) == json.dumps(value)  # anything else as SQLAlchemy writes it
