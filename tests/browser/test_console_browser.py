"""The console in a real headless Chromium, against a real example server and `handles console`.

The operator signs in, watches a job's progress move without a reload, reads a job's steps and
question, answers deploy_release's question from the form and sees the job finish, cancels a job;
a visitor without the token sees nothing; a `<script>` in a status message stays text.
"""

from __future__ import annotations

from typing import Any

from handles.store import JobRepository
from tests.browser.conftest import Deployment
from tests.console.support import TOKEN
from tests.store.test_repository_contract import OWNER, claimed_job
from tests.support import connect, job_id_of

TIMEOUT_MS = 30_000


async def sign_in(browser: Any, console_url: str, name: str = "erin") -> Any:
    page = await browser.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    await page.goto(f"{console_url}/login")
    await page.fill("#name", name)
    await page.fill("#token", TOKEN)
    await page.click("button:has-text('Sign in')")
    await page.wait_for_selector("h1:has-text('Jobs')")
    return page


async def test_an_unauthenticated_visitor_gets_nothing(
    deployment: Deployment, browser: Any, signing_key: str
) -> None:
    async with connect(deployment.server.url) as client:
        handle = str((await client.call("deploy_release_start", {"version": "9.9.9"}))["handle"])
    job_id = job_id_of(handle, signing_key)
    page = await browser.new_page()
    for path in ("/", f"/jobs/{job_id}", "/overview", "/api/jobs"):
        reply = await page.goto(deployment.console_url + path)
        assert reply is not None and reply.status == 401, path
        text = await page.content()
        assert "9.9.9" not in text and "deploy_release" not in text, path
    await page.goto(deployment.console_url + "/")
    assert await page.is_visible("#token"), "the login form, and nothing else"


async def test_the_jobs_list_shows_a_started_job_and_its_progress_moves_without_a_reload(
    deployment: Deployment, browser: Any, signing_key: str
) -> None:
    page = await sign_in(browser, deployment.console_url)
    async with connect(deployment.server.url) as client:
        handle = str(
            (await client.call("generate_report_start", {"account": "acme", "months": 12}))["handle"]
        )
        job_id = job_id_of(handle, signing_key)
        row = f'tr[data-id="{job_id}"]'
        await page.wait_for_selector(row)  # appears by the live poll: the page was loaded before the start
        assert "generate_report" in await page.inner_text(row)
        await page.evaluate("window.__notReloaded = true")
        await page.wait_for_function(
            """([row]) => {
                const pct = document.querySelector(row + ' .pct');
                return pct && parseInt(pct.textContent) >= 25 && window.__notReloaded === true;
            }""",
            arg=[row],
        )
        await client.wait_status("generate_report", handle, "completed", timeout=60)
        await page.wait_for_function(
            "([row]) => document.querySelector(row + ' .badge').textContent === 'completed' && window.__notReloaded",
            arg=[row],
        )
        assert (await page.inner_text(f"{row} .pct")) == "100%"


async def test_answering_deploy_release_from_the_form_lets_it_finish(
    deployment: Deployment, browser: Any, signing_key: str
) -> None:
    page = await sign_in(browser, deployment.console_url, name="frank")
    async with connect(deployment.server.url) as client:
        handle = str((await client.call("deploy_release_start", {"version": "2.4.0"}))["handle"])
        job_id = job_id_of(handle, signing_key)
        await client.wait_status("deploy_release", handle, "input_required", timeout=60)
        await page.goto(f"{deployment.console_url}/jobs/{job_id}")
        timeline = await page.inner_text("ol.timeline")
        for step in ("build", "test", "package"):
            assert step in timeline
        question = await page.inner_text(".question .message")
        assert "Release 2.4.0 is built and tested" in question
        await page.select_option("select[name=approve]", "true")
        await page.select_option("select[name=environment]", "staging")
        await page.click("button:has-text('Send answer')")
        await page.wait_for_selector("text=by operator:frank")
        done = await client.wait_status("deploy_release", handle, "completed", timeout=60)
        assert done["status"] == "completed"
    await page.reload()
    assert "completed" in await page.inner_text("h1")
    for step in ("upload", "migrate", "switch traffic"):
        assert step in await page.inner_text("ol.timeline")


async def test_cancel_from_the_browser_stops_the_job(
    deployment: Deployment, browser: Any, signing_key: str
) -> None:
    page = await sign_in(browser, deployment.console_url, name="gina")
    async with connect(deployment.server.url) as client:
        handle = str((await client.call("export_dataset_start", {"rows": 100_000}))["handle"])
        job_id = job_id_of(handle, signing_key)
        await page.goto(f"{deployment.console_url}/jobs/{job_id}")
        await page.click("text=Cancel this job")
        await page.click("button:has-text('Yes, cancel it')")
        await page.wait_for_selector("text=by operator:gina")
        ended = await client.wait_status("export_dataset", handle, "cancelled", timeout=60)
        assert ended["status"] == "cancelled"


async def test_a_script_in_a_status_message_is_shown_as_text(deployment: Deployment, browser: Any) -> None:
    attack = "<script>window.__owned = true; alert('owned')</script>"
    repo = JobRepository(deployment.database_url)
    try:
        job = claimed_job(repo, kind="imported", owner=OWNER)  # a kind no node runs: it stays as written
        repo.set_progress(job.id, OWNER, None, None, attack)
    finally:
        repo.dispose()
    page = await sign_in(browser, deployment.console_url)
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: dialogs.append(dialog.message))
    await page.wait_for_timeout(2_500)  # one live update redraws the rows
    assert await page.is_visible(f"text={attack}")
    await page.goto(f"{deployment.console_url}/jobs/{job.id}")
    assert attack in await page.inner_text("table.facts")
    assert dialogs == [] and await page.evaluate("window.__owned === undefined")
