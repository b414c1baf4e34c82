"""Regenerate the console screenshots in docs/img/ from a real run.

    .venv/bin/python bench/console_screenshots.py

Starts the example server over HTTP and `handles console` beside it (the browser tests' harness),
starts a few jobs through MCP (reports under way, a deploy_release waiting for its answer, an
export cancelled by an operator), and photographs the jobs list and the deploy_release job page in
Debian's Chromium (/usr/bin/chromium) driven by Playwright.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.console.support import TOKEN, console_process
from tests.support import HttpExampleServer, connect, free_port, job_id_of

DOCS_IMG = Path(__file__).resolve().parent.parent / "docs" / "img"


async def main() -> None:
    from playwright.async_api import async_playwright

    key = secrets.token_urlsafe(48)
    data = Path(tempfile.mkdtemp(prefix="console-shots-"))
    server = HttpExampleServer(data, [key], env={"EXAMPLE_JOB_SECONDS": "40"}).start()
    port = free_port()
    console = console_process(data, [key], port).start()
    base = f"http://127.0.0.1:{port}"
    try:
        async with connect(server.url) as client:
            deploy = str((await client.call("deploy_release_start", {"version": "2.4.0"}))["handle"])
            export = str((await client.call("export_dataset_start", {"rows": 50_000}))["handle"])
            await client.call("generate_report_start", {"account": "acme", "months": 12})
            await client.call("generate_report_start", {"account": "globex", "months": 6})
            await client.wait_status("deploy_release", deploy, "input_required", timeout=60)
            async with async_playwright() as playwright:
                browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
                page = await browser.new_page(viewport={"width": 1280, "height": 720})
                await page.goto(f"{base}/login")
                await page.fill("#name", "erin")
                await page.fill("#token", TOKEN)
                await page.click("button:has-text('Sign in')")
                await page.goto(f"{base}/jobs/{job_id_of(export, key)}/cancel")
                await page.click("button:has-text('Yes, cancel it')")
                await client.wait_status("export_dataset", export, "cancelled", timeout=60)
                await page.goto(f"{base}/")
                await page.wait_for_timeout(2_500)  # a live update
                DOCS_IMG.mkdir(parents=True, exist_ok=True)
                await page.screenshot(path=str(DOCS_IMG / "console-jobs.png"))
                await page.goto(f"{base}/jobs/{job_id_of(deploy, key)}")
                await page.screenshot(path=str(DOCS_IMG / "console-job.png"), full_page=True)
                await browser.close()
    finally:
        console.stop()
        server.stop()
    print(f"wrote {DOCS_IMG / 'console-jobs.png'} and {DOCS_IMG / 'console-job.png'}")


if __name__ == "__main__":
    asyncio.run(main())
