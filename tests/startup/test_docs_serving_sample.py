"""The docs' own serving sample (docs/auth.md's server, run as a program) fails in one line.

The page's first sample is saved to a file as the reader would save it and run as a program in a
subprocess, its `__main__` block included (tests/docs/test_doc_samples.py runs it without that block).
Misconfigured, its whole stderr is one line saying what to do, with exit code 2: no traceback, and no
warning from the SDK either.
"""

from __future__ import annotations

from pathlib import Path

from handles.store import migrate
from tests.docs.test_doc_samples import ROOT, samples
from tests.harness.postgres import fresh_schema
from tests.startup.support import assert_one_line_failure, run_program
from tests.support import free_port, new_key

MAIN = 'if __name__ == "__main__":'


def server_sample() -> str:
    """docs/auth.md's server sample, on a free port rather than 8000."""
    server = samples(ROOT / "docs" / "auth.md")[0]
    assert MAIN in server and "8000" in server
    return server.replace("8000", str(free_port()))


def test_without_signing_keys_it_says_how_to_make_one(tmp_path: Path) -> None:
    done = run_program(tmp_path, server_sample())
    assert_one_line_failure(done, "reports", "HANDLES_SECRET_KEYS", "handles keygen")


def test_on_a_postgresql_schema_never_upgraded_it_says_to_run_db_upgrade(
    tmp_path: Path, postgres_url: str
) -> None:
    with fresh_schema(postgres_url.split("?")[0], "docs_sample") as url:
        done = run_program(tmp_path, server_sample(), HANDLES_DATABASE_URL=url, HANDLES_SECRET_KEYS=new_key())
    assert_one_line_failure(done, "reports", migrate.head_revision(), "handles db upgrade")


def test_configured_it_builds_its_server_without_a_warning(tmp_path: Path) -> None:
    """The sample's settings and server, built (not served) with a key: nothing on stderr at all."""
    building = server_sample().split(MAIN)[0] + "build_server(8000)\n"
    done = run_program(tmp_path, building, HANDLES_SECRET_KEYS=new_key())
    assert done.returncode == 0 and done.stderr == "", done.stderr
