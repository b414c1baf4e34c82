"""A connection of a test's own to a store's database (SQLite or PostgreSQL), apart from the store's pools."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, create_engine


@contextmanager
def own_connection(url: str, **engine_options: Any) -> Iterator[Connection]:
    """A connection on an engine made for this block alone, in a transaction committed at its end; the engine
    is disposed afterwards, so nothing of it stays open."""
    engine = create_engine(url, **engine_options)
    try:
        with engine.begin() as connection:
            yield connection
    finally:
        engine.dispose()
