"""Reading the audit evidence (what `handles audit export` pages through) takes no write lock: on an SQLite
file it reads while another connection holds the writer's lock, and writers never wait for an export."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from handles.store import JobRepository


def test_evidence_is_read_while_another_connection_holds_the_write_lock(
    sqlite_repo: JobRepository, sqlite_path: Path
) -> None:
    writer = sqlite3.connect(sqlite_path, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")  # a writer mid-transaction: the lock an export must not need
        began = time.monotonic()
        assert sqlite_repo.archived_evidence() == []
        assert sqlite_repo.live_evidence() == []
        assert time.monotonic() - began < 2, "the evidence read waited for the writer's lock"
    finally:
        writer.execute("ROLLBACK")
        writer.close()
