"""`handles db upgrade` on SQLite, as a subprocess in a fresh folder: it makes the data folder as a server
does, and an SQLite file it cannot open is named with its folder, never as a server to check."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from handles.store import migrate
from tests.cli.test_cli import HANDLES, KEY
from tests.startup.support import assert_one_line_failure


def handles_in(folder: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`handles ARGS` run in `folder`, with no HANDLES_DATA_DIR or HANDLES_DATABASE_URL unless given."""
    environment = {
        k: v for k, v in os.environ.items() if k not in ("HANDLES_DATA_DIR", "HANDLES_DATABASE_URL")
    }
    environment.update(HANDLES_SECRET_KEYS=KEY, **env)
    return subprocess.run(
        [str(HANDLES), *args], cwd=folder, capture_output=True, text=True, env=environment, timeout=60
    )


def test_db_upgrade_in_a_fresh_folder_makes_the_default_database(tmp_path: Path) -> None:
    upgraded = handles_in(tmp_path, "db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr
    assert f"empty -> {migrate.head_revision()}" in upgraded.stdout
    assert (tmp_path / ".handles" / "handles.db").is_file()
    listed = handles_in(tmp_path, "jobs", "list", "--json")
    assert listed.returncode == 0 and listed.stdout.strip() == "[]", listed.stderr


def test_db_upgrade_makes_a_nested_data_dir_and_a_url_folder(tmp_path: Path) -> None:
    nested = handles_in(tmp_path, "db", "upgrade", HANDLES_DATA_DIR="state/handles")
    assert nested.returncode == 0, nested.stderr
    assert (tmp_path / "state" / "handles" / "handles.db").is_file()
    url = f"sqlite:///{(tmp_path / 'db' / 'here' / 'jobs.db').as_posix()}"
    by_url = handles_in(tmp_path, "db", "upgrade", "--database-url", url)
    assert by_url.returncode == 0, by_url.stderr
    assert (tmp_path / "db" / "here" / "jobs.db").is_file()


def test_an_sqlite_file_that_cannot_be_opened_is_named_with_its_folder(tmp_path: Path) -> None:
    (tmp_path / "taken.db").mkdir()  # a folder where the database file should be
    url = f"sqlite:///{(tmp_path / 'taken.db').as_posix()}"
    line = assert_one_line_failure(
        handles_in(tmp_path, "db", "upgrade", "--database-url", url),
        "handles",
        f"SQLite database file {tmp_path / 'taken.db'}",
        f"folder {tmp_path}",
    )
    assert "server" not in line, line


def test_a_data_folder_that_cannot_be_made_is_named(tmp_path: Path) -> None:
    (tmp_path / "plain-file").write_text("not a folder")
    line = assert_one_line_failure(
        handles_in(tmp_path, "db", "upgrade", HANDLES_DATA_DIR=str(tmp_path / "plain-file" / "data")),
        "handles",
        f"folder {tmp_path / 'plain-file' / 'data'}",
    )
    assert "server" not in line, line
