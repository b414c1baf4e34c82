"""`uvicorn.run(streamable_http_app(...))` by hand: a start refused for its configuration is logged as its
one sentence by uvicorn, between uvicorn's own lines, with no traceback."""

from __future__ import annotations

from pathlib import Path

from tests.startup.support import outdated_sqlite, run_program
from tests.support import free_port, new_key

PROGRAM = """
import uvicorn
from mcp.server.mcpserver import MCPServer

from handles import Handles, JobContext, streamable_http_app

jobs = Handles()


@jobs.job
async def nap(ctx: JobContext, n: int) -> int:
    return n


server = MCPServer("nap")
jobs.bind(server)
uvicorn.run(streamable_http_app(server, jobs), host="127.0.0.1", port={port})
"""


def test_an_outdated_schema_is_one_error_line_not_a_traceback(tmp_path: Path) -> None:
    url = outdated_sqlite(tmp_path / "old.db")
    done = run_program(
        tmp_path,
        PROGRAM.format(port=free_port()),
        HANDLES_DATABASE_URL=url,
        HANDLES_AUTO_MIGRATE="0",
        HANDLES_SECRET_KEYS=new_key(),
    )
    assert done.returncode != 0, done.stderr
    assert "Traceback" not in done.stderr and "File " not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 2, done.stderr  # the sentence, then uvicorn's "Application startup failed."
    assert "0003" in errors[0] and "handles db upgrade" in errors[0], errors
    assert "Application startup failed" in errors[1], errors
