"""Fixtures of the console tests: the signing key the console's sealer reads, a store to look at."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from handles.store import JobRepository
from tests.multinode.conftest import pg_url  # noqa: F401 (a fresh PostgreSQL schema at the head revision, for two nodes)


@pytest.fixture(autouse=True)
def _signing_keys(monkeypatch: pytest.MonkeyPatch, signing_key: str) -> None:
    """The console reads HANDLES_SECRET_KEYS, like the CLI, to seal sensitive answers."""
    monkeypatch.setenv("HANDLES_SECRET_KEYS", signing_key)


@pytest.fixture
def repo(database_url: str) -> Iterator[JobRepository]:
    """The store the console shows (SQLite file and PostgreSQL), at the current schema."""
    repository = JobRepository(database_url)
    repository.prepare(auto_migrate=True)
    try:
        yield repository
    finally:
        repository.dispose()


@pytest.fixture
def url(repo: JobRepository) -> str:
    return repo.engine.url.render_as_string(hide_password=False)
