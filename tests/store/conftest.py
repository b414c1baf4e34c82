"""Fixtures of the store tests: an SQLite file, a repository on each store with a clock the test moves, and a
listener of PostgreSQL's change notices."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from handles.store import JobRepository
from tests.harness.postgres import listening, repository
from tests.store.support import MovableClock


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    """The path of the test's SQLite file."""
    return tmp_path / "store.db"


@pytest.fixture
def sqlite_repo(sqlite_path: Path) -> Iterator[JobRepository]:
    """A `JobRepository` on the test's SQLite file, its tables created; disposed afterwards."""
    with repository(f"sqlite:///{sqlite_path.as_posix()}") as repo:
        yield repo


@pytest.fixture
def clock() -> MovableClock:
    return MovableClock()


@pytest.fixture
def repo(database_url: str, clock: MovableClock) -> Iterator[JobRepository]:
    """A `JobRepository` on an empty database (SQLite file, then PostgreSQL) on the test's clock."""
    with repository(database_url, clock=clock) as repo:
        yield repo


@pytest.fixture
def listener(postgres_url: str) -> Iterator[psycopg.Connection]:
    """A connection that LISTENs on the store's change-notice channel of the test's PostgreSQL schema."""
    with listening(postgres_url) as connection:
        yield connection
