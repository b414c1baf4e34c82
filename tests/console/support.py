"""Shared by the console tests: a console on a real store, signed-in clients, forms' CSRF tokens."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from example_server.server import Approval
from handles.console import console_app
from handles.elicitation import elicitation_schema
from handles.store import JobRecord, JobRepository
from tests.harness.process import ServerProcess
from tests.store.test_repository_contract import OWNER, new_job
from tests.support import claim

TOKEN = "console-token-" + "t" * 30
APPROVAL = elicitation_schema(Approval)
"""deploy_release's real question schema: approve (boolean), environment (staging or production)."""
HANDLES = Path(sys.executable).parent / "handles"


def console_process(data_dir: Path, keys: Sequence[str], port: int) -> ServerProcess:
    """`handles console --port <port>` (not started yet) on the SQLite store in `data_dir`, signed in with
    `TOKEN`."""
    env = dict(
        os.environ,
        HANDLES_DATA_DIR=str(data_dir),
        HANDLES_SECRET_KEYS=",".join(keys),
        HANDLES_CONSOLE_TOKEN=TOKEN,
    )
    env.pop("HANDLES_DATABASE_URL", None)
    return ServerProcess(
        [str(HANDLES), "console", "--port", str(port)],
        env,
        data_dir / "console.log",
        port,
        name="the console",
    )


@contextmanager
def console(url: str, *, signed_in_as: str | None = "alice") -> Iterator[TestClient]:
    """A TestClient on `console_app(url)`; signed in through the login form as `signed_in_as`."""
    with TestClient(console_app(url, token=TOKEN), follow_redirects=False) as client:
        if signed_in_as is not None:
            reply = client.post("/login", data={"token": TOKEN, "name": signed_in_as, "next": "/"})
            assert reply.status_code == 303, reply.text
        yield client


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "the page carries a CSRF token in its forms"
    return found.group(1)


def asking_job(repo: JobRepository, message: str = "Deploy 2.4.0?", **options: Any) -> JobRecord:
    """A job claimed by OWNER that asked the deploy_release question `q1` (and so is parked for an answer)."""
    job = new_job(repo, kind="deploy_release", **options)
    assert claim(repo, job.id, OWNER, 30) is not None
    assert repo.open_input(job.id, OWNER, "q1", message, APPROVAL) is None
    stored = repo.get(job.id)
    assert stored is not None
    return stored
