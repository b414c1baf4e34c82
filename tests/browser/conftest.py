"""A real deployment for the browser: the example server over HTTP, `handles console` beside it on the
same SQLite file (both subprocesses), and Debian's Chromium driven by Playwright.

Playwright cannot download its own browser here, so it launches /usr/bin/chromium. Without it these
tests skip, unless `CI` is set: then they fail (`.ci/run` installs the package).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.console.support import console_process
from tests.support import HttpExampleServer, free_port

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def chromium_or_skip() -> Path:
    if CHROMIUM.exists():
        return CHROMIUM
    message = f"{CHROMIUM} is missing: install Debian's chromium package (apt-get install chromium)"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI is set, so the browser tests must run", pytrace=False)
    pytest.skip(message)


@dataclass
class Deployment:
    server: HttpExampleServer
    console_url: str

    @property
    def database_url(self) -> str:
        return f"sqlite:///{(self.server.data_dir / 'handles.db').as_posix()}"


@pytest.fixture
def deployment(tmp_path: Path, signing_key: str) -> Iterator[Deployment]:
    """Jobs of about 8 s, so a browser sees them move."""
    chromium_or_skip()
    server = HttpExampleServer(tmp_path / "data", [signing_key], env={"EXAMPLE_JOB_SECONDS": "8"}).start()
    port = free_port()
    console = console_process(server.data_dir, [signing_key], port).start()
    try:
        yield Deployment(server, f"http://127.0.0.1:{port}")
    finally:
        console.stop()
        server.stop()


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    executable = chromium_or_skip()
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=str(executable), args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            await launched.close()
