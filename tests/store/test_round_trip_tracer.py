"""The round-trip counter that bench section 8 and `test_postgres_start.py` rely on (`bench.round_trips.Tracer`)
counts each operation's own round trips: libpq's buffered trace stream is flushed before each mark and
count, and two connections checked out at once get a trace file each."""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text

from bench.round_trips import Tracer


@pytest.fixture
def engine(postgres_url: str) -> Iterator[Engine]:
    engine = create_engine(postgres_url, isolation_level="AUTOCOMMIT", pool_size=8)  # as the store's reads
    try:
        yield engine
    finally:
        engine.dispose()


def test_an_operation_on_another_connection_is_counted_with_its_own_round_trip(engine: Engine) -> None:
    """libpq buffers its trace: without a flush, the last line of a statement (the server's ReadyForQuery)
    reaches the file only when its connection sends again, so an operation on another connection counted 0."""
    tracer = Tracer(Path(tempfile.mkdtemp(prefix="trips-")))
    tracer.attach(engine)
    try:
        with engine.connect() as first, engine.connect() as second:
            for round_ in range(3):
                for name, connection in (("first", first), ("second", second)):
                    mark = tracer.mark()
                    connection.execute(text(f"SELECT {round_} AS handles_{name}")).all()
                    assert tracer.since(mark) == (1, [f"SELECT handles_{name}"]), (round_, name)
    finally:
        tracer.close()


def test_connections_checked_out_at_once_each_get_a_trace_file_of_their_own(engine: Engine) -> None:
    directory = Path(tempfile.mkdtemp(prefix="trips-"))
    tracer = Tracer(directory)
    tracer.attach(engine)
    barrier = threading.Barrier(6)

    def check_out() -> None:
        barrier.wait()
        with engine.connect() as connection:
            barrier.wait()  # all six held at once: six connections
            connection.execute(text("SELECT 1")).all()

    threads = [threading.Thread(target=check_out) for _ in range(6)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(list(directory.glob("*.trace"))) == 6
    finally:
        tracer.close()
