"""`UTC_TIME` on SQLite (its one-step variant) writes exactly the text SQLAlchemy's generic path (`UTCDateTime`)
writes, and reads back exactly the time the generic path reads."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import select
from sqlalchemy.dialects import sqlite
from sqlalchemy.types import DateTime, TypeDecorator

from handles.store.models import UTC_TIME, JobRecord, UTCDateTime

DIALECT = sqlite.dialect()


def generic_text(value: datetime) -> str:
    """The two-step path the one-step bind replaces: `process_bind_param`, then SQLite DATETIME's format."""
    utc = UTCDateTime().process_bind_param(value, DIALECT)
    process = DateTime(timezone=True).dialect_impl(DIALECT).bind_processor(DIALECT)
    assert process is not None
    text: str = process(utc)
    return text


def test_the_one_step_bind_writes_the_generic_text_for_any_time_and_offset() -> None:
    bind = UTC_TIME.dialect_impl(DIALECT).bind_processor(DIALECT)
    assert bind is not None
    rnd = random.Random(14)
    checked = 0
    for _ in range(5000):
        offset = timezone(timedelta(minutes=rnd.randint(-14 * 60, 14 * 60)))
        value = datetime(
            rnd.randint(2, 9998), rnd.randint(1, 12), rnd.randint(1, 28), rnd.randint(0, 23), rnd.randint(0, 59),
            rnd.randint(0, 59), rnd.choice([0, rnd.randint(0, 999_999)]), tzinfo=rnd.choice([UTC, offset]),
        )  # fmt: skip
        assert bind(value) == generic_text(value), value
        checked += 1
    assert checked == 5000
    assert bind(None) is None
    assert bind(datetime(2026, 12, 1, 8, 0, tzinfo=UTC)) == "2026-12-01 08:00:00.000000"


def test_the_one_step_bind_refuses_a_naive_time() -> None:
    bind = UTC_TIME.dialect_impl(DIALECT).bind_processor(DIALECT)
    assert bind is not None
    with pytest.raises(ValueError, match="naive datetime"):
        bind(datetime(2026, 12, 1, 8, 0))


def test_a_comparison_binds_the_same_text_as_a_stored_time() -> None:
    """A `WHERE run_after <= :now` compares text with text: both sides must be written alike."""
    when = datetime(2026, 12, 1, 8, 0, 0, 5, tzinfo=timezone(timedelta(hours=2)))
    compiled = select(JobRecord.id).where(JobRecord.run_after <= when).compile(dialect=DIALECT)  # type: ignore[arg-type]
    binds = [bind for bind in compiled.binds.values() if bind.value is when]
    assert binds
    for bind in binds:
        process = bind.type.dialect_impl(DIALECT).bind_processor(DIALECT)
        assert process is not None
        assert process(when) == "2026-12-01 06:00:00.000005" == generic_text(when)


def generic_time(text: str | None) -> datetime | None:
    """The two-step read the one-step result processor replaces: SQLite DATETIME's parse of the text, then
    `process_result_value`, as the decorator's own result processor chains them."""
    process = TypeDecorator.result_processor(UTCDateTime().dialect_impl(DIALECT), DIALECT, None)
    assert process is not None
    value: datetime | None = process(text)
    return value


def test_the_one_step_read_gives_the_generic_time_for_every_text_sqlite_holds() -> None:
    """What a write stored (with and without microseconds), and a text with an offset written by hand."""
    read = UTC_TIME.dialect_impl(DIALECT).result_processor(DIALECT, None)
    bind = UTC_TIME.dialect_impl(DIALECT).bind_processor(DIALECT)
    assert read is not None and bind is not None
    rnd = random.Random(48)
    texts: list[str | None] = [
        None,
        "2026-12-01 08:00:00",
        "2026-12-01 08:00:00+02:00",
        "2026-12-01T08:00:00.5Z",
    ]
    for _ in range(5000):
        value = datetime(
            rnd.randint(2, 9998), rnd.randint(1, 12), rnd.randint(1, 28), rnd.randint(0, 23), rnd.randint(0, 59),
            rnd.randint(0, 59), rnd.choice([0, rnd.randint(0, 999_999)]), tzinfo=UTC,
        )  # fmt: skip
        texts.append(bind(value))
    for text in texts:
        got, expected = read(text), generic_time(text)
        assert got == expected and (got is None or got.tzinfo is UTC), text
    assert read("2026-12-01 08:00:00.000005") == datetime(2026, 12, 1, 8, 0, 0, 5, tzinfo=UTC)
