"""The docs' own serving sample (docs/auth.md's server, run as `python server.py`) fails in one line.

The page's first sample is written to a file as the reader would save it and run as a program in a
subprocess, its `__main__` block included (tests/docs/test_doc_samples.py runs it without that block).
Misconfigured, its whole stderr is one line saying what to do, with exit code 2: no traceback, and no
warning from the SDK either.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from handles.store import migrate
from tests.docs.test_doc_samples import ROOT, samples
from tests.harness.postgres import fresh_schema
from tests.startup.support import assert_one_line_failure
from tests.support import free_port, new_key

SERVER_PAGE = ROOT / "docs" / "auth.md"


def run_server_sample(folder: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """docs/auth.md's server sample as `python server.py` in `folder` (on a free port, not 8000)."""
    server = samples(SERVER_PAGE)[0]
    assert 'if __name__ == "__main__":' in server and "8000" in server
    script = folder / "server.py"
    script.write_text(server.replace("8000", str(free_port())))
    environment = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("HANDLES_") and k not in ("PYTHONWARNINGS", "PYTHONPATH")
    }
    environment.update(PYTHONPATH=str(ROOT), HANDLES_DATA_DIR=str(folder / "data"), **env)
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=folder,
        env=environment,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_without_signing_keys_it_says_how_to_make_one(tmp_path: Path) -> None:
    assert_one_line_failure(run_server_sample(tmp_path), "reports", "HANDLES_SECRET_KEYS", "handles keygen")


def test_on_a_postgresql_schema_never_upgraded_it_says_to_run_db_upgrade(
    tmp_path: Path, postgres_url: str
) -> None:
    with fresh_schema(postgres_url.split("?")[0], "docs_sample") as url:
        done = run_server_sample(tmp_path, HANDLES_DATABASE_URL=url, HANDLES_SECRET_KEYS=new_key())
    assert_one_line_failure(done, "reports", migrate.head_revision(), "handles db upgrade")


def test_configured_it_builds_its_server_without_a_warning(tmp_path: Path) -> None:
    """The sample's settings and server, built (not served) with a key: nothing on stderr at all."""
    building = samples(SERVER_PAGE)[0].split('if __name__ == "__main__":')[0] + "build_server(8000)\n"
    environment = dict(
        os.environ, PYTHONPATH=str(ROOT), HANDLES_DATA_DIR=str(tmp_path), HANDLES_SECRET_KEYS=new_key()
    )
    environment.pop("PYTHONWARNINGS", None)
    done = subprocess.run(
        [sys.executable, "-W", "default", "-c", building],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
