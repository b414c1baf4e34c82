"""A server that cannot start says why in one line on stderr and exits 2: no traceback, no password.

Real processes: `python -m example_server` over stdio and `--http`, on an unreachable PostgreSQL,
an outdated SQLite schema, and without a signing key. (The `handles` command's cases are in
tests/cli/test_cli.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from handles.store import migrate
from tests.startup.support import UNREACHABLE_URL, assert_one_line_failure, example_server, outdated_sqlite
from tests.support import example_env, free_port, new_key

MODES = {"stdio": (), "http": ("--http",)}


def test_stdio_server_on_an_unreachable_database(tmp_path: Path) -> None:
    env = example_env(tmp_path, [new_key()], HANDLES_DATABASE_URL=UNREACHABLE_URL)
    line = assert_one_line_failure(
        example_server(env),
        "example_server",
        "Cannot reach the database",
        "127.0.0.1:9",
        "HANDLES_DATABASE_URL",
    )
    assert "***" in line


@pytest.mark.parametrize("mode", MODES)
def test_outdated_schema_says_to_run_db_upgrade(tmp_path: Path, mode: str) -> None:
    url = outdated_sqlite(tmp_path / "old.db")
    env = example_env(tmp_path, [new_key()], HANDLES_DATABASE_URL=url, HANDLES_AUTO_MIGRATE="0")
    args = (*MODES[mode], "--port", str(free_port())) if mode == "http" else ()
    assert_one_line_failure(
        example_server(env, *args), "example_server", "0003", migrate.head_revision(), "handles db upgrade"
    )


@pytest.mark.parametrize("mode", MODES)
def test_missing_key_says_how_to_make_one(tmp_path: Path, mode: str) -> None:
    env = example_env(tmp_path, [])
    del env["HANDLES_SECRET_KEYS"]
    args = (*MODES[mode], "--port", str(free_port())) if mode == "http" else ()
    assert_one_line_failure(
        example_server(env, *args), "example_server", "HANDLES_SECRET_KEYS", "handles keygen"
    )
