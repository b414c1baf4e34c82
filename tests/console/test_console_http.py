"""The operator console over HTTP (Starlette's TestClient) on a real store: SQLite file and PostgreSQL."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta
from itertools import count
from pathlib import Path

import pytest

from handles.principal import readable, token_form
from handles.sealing import Sealer, is_sealed
from handles.states import Status
from handles.store import JobRepository
from tests.console.support import TOKEN, asking_job, console, csrf_of
from tests.store.test_repository_contract import OTHER_OWNER, OWNER, claimed_job, new_job
from tests.support import claim, get_input


def test_an_unauthenticated_visitor_learns_nothing_about_any_job(repo: JobRepository, url: str) -> None:
    job = asking_job(repo, message="Deploy secret-project-x?")
    paths = ["/", f"/jobs/{job.id}", f"/jobs/{job.id}?reveal=1", "/overview", f"/jobs/{job.id}/cancel"]
    with console(url, signed_in_as=None) as anonymous:
        for path in paths:
            reply = anonymous.get(path)
            assert reply.status_code == 401, path
            assert "Sign in" in reply.text
            for secret in ("secret-project-x", "deploy_release", "acme", "local alice", "operator:"):
                assert secret not in reply.text, (path, secret)
            made_up = anonymous.get(path.replace(job.id, "no-such-job-000000000000"))
            assert made_up.text.replace("no-such-job-000000000000", job.id) == reply.text, (
                "a real job's id gets the very page a made-up one gets (only the path typed is echoed back)"
            )
        feed = anonymous.get("/api/jobs")
        assert feed.status_code == 401 and job.id not in feed.text
        for headers in ({"Authorization": "Bearer wrong-token-000000000000"}, {"Authorization": "Basic x"}):
            assert anonymous.get("/api/jobs", headers=headers).status_code == 401
        forged = anonymous.cookies.set("handles_console", "eyJuYW1lIjoiZXZlIn0.00")  # type: ignore[func-returns-value]
        assert forged is None and anonymous.get("/").status_code == 401
        refused = anonymous.post(f"/jobs/{job.id}/cancel", data={"confirm": "yes"})
        assert refused.status_code == 401 and job.id not in refused.text
        answered = anonymous.post(
            f"/jobs/{job.id}/answer/q1", data={"approve": "true", "environment": "staging"}
        )
        assert answered.status_code == 401
        wrong = anonymous.post("/login", data={"token": "not-the-token", "name": "eve", "next": "/"})
        assert wrong.status_code == 401 and "handles_console" not in wrong.headers.get("set-cookie", "")
    after = repo.get(job.id)
    assert after is not None and after.cancel_requested_at is None and after.status == Status.INPUT_REQUIRED


def test_signing_in_sets_a_strict_http_only_cookie_and_a_bearer_token_works_too(
    repo: JobRepository, url: str
) -> None:
    job = new_job(repo)
    with console(url, signed_in_as=None) as client:
        reply = client.post("/login", data={"token": TOKEN, "name": "alice", "next": f"/jobs/{job.id}"})
        assert reply.status_code == 303 and reply.headers["location"] == f"/jobs/{job.id}"
        cookie = reply.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        page = client.get(f"/jobs/{job.id}")
        assert page.status_code == 200 and job.id in page.text and "operator:alice" in page.text
        away = client.post("/login", data={"token": TOKEN, "name": "alice", "next": "https://evil.example/"})
        assert away.headers["location"] == "/", "never an open redirect"
    with console(url, signed_in_as=None) as script:
        feed = script.get("/api/jobs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert feed.status_code == 200 and [row["id"] for row in feed.json()["jobs"]] == [job.id]


def test_forms_without_the_sessions_csrf_token_are_refused(repo: JobRepository, url: str) -> None:
    job = new_job(repo)
    with console(url) as client:
        for data in ({"confirm": "yes"}, {"confirm": "yes", "csrf": "0" * 64}):
            assert client.post(f"/jobs/{job.id}/cancel", data=data).status_code == 403
    with console(url, signed_in_as="bob") as other:
        token_of_bob = csrf_of(other.get(f"/jobs/{job.id}/cancel").text)
    with console(url) as client:
        refused = client.post(f"/jobs/{job.id}/cancel", data={"confirm": "yes", "csrf": token_of_bob})
        assert refused.status_code == 403, "another session's token does not do"
    stored = repo.get(job.id)
    assert stored is not None and stored.cancel_requested_at is None and stored.status == Status.WORKING


def test_what_a_job_wrote_is_shown_as_text(repo: JobRepository, url: str) -> None:
    attack = '<script>alert("owned")</script><img src=x onerror=alert(1)>'
    job = asking_job(repo, message=f"Deploy? {attack}")
    repo.set_progress(job.id, OWNER, None, None, attack)
    repo.begin_step(job.id, OWNER, f"step {attack}", 1)
    with console(url) as client:
        for path in ("/", f"/jobs/{job.id}"):
            text = client.get(path).text
            assert "<script>alert" not in text and "<img src=x" not in text, path
            assert "&lt;script&gt;alert(&quot;owned&quot;)&lt;/script&gt;" in text, path
        row = client.get("/api/jobs").json()["jobs"][0]
        assert row["message"] == attack, "the feed carries the text; the page script sets it as textContent"


def test_filters_by_status_kind_and_principal(repo: JobRepository, url: str) -> None:
    carol = token_form("https://issuer.example", "ci-bot", "carol")
    report = new_job(repo, kind="generate_report", principal="local:alice")
    export = new_job(repo, kind="export_dataset", principal=carol)
    parked = asking_job(repo, principal=carol)
    with console(url) as client:

        def ids(**query: str) -> set[str]:
            reply = client.get("/api/jobs", params=query)
            assert reply.status_code == 200
            return {row["id"] for row in reply.json()["jobs"]}

        assert ids() == {report.id, export.id, parked.id}
        assert ids(status="input_required") == {parked.id}
        assert ids(kind="export_dataset") == {export.id}
        assert ids(principal="carol") == {export.id, parked.id}, "a token's subject finds its jobs"
        assert ids(principal="alice") == {report.id}, "a local name finds its jobs"
        assert ids(principal="carol", kind="deploy_release", status="input_required") == {parked.id}
        assert ids(status="failed") == set()
        page = client.get("/", params={"principal": "carol"}).text
        assert html.escape(readable(carol)) in page, "the principal in readable form"
        assert report.id not in page


def test_keyset_pages_walk_every_job_once_newest_first(database_url: str) -> None:
    moments = count()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    # two jobs per instant: the id breaks the tie, so no job is skipped or repeated at a page edge
    repo = JobRepository(database_url, clock=lambda: start + timedelta(seconds=next(moments) // 2))
    repo.prepare(auto_migrate=True)
    try:
        made = [new_job(repo, kind="generate_report") for _ in range(123)]
        url = repo.engine.url.render_as_string(hide_password=False)
        with console(url) as client:
            seen: list[str] = []
            cursor: str | None = None
            pages = 0
            while True:
                reply = client.get("/api/jobs", params={"after": cursor} if cursor else {}).json()
                seen += [row["id"] for row in reply["jobs"]]
                pages += 1
                cursor = reply["next"]
                if cursor is None:
                    break
            html = client.get("/").text
            assert 'id="older"' in html
    finally:
        repo.dispose()
    expected = [job.id for job in sorted(made, key=lambda job: (job.created_at, job.id), reverse=True)]
    assert seen == expected and pages == 3


def test_an_answer_is_checked_as_respond_checks_it_and_recorded_as_the_operator(
    repo: JobRepository, url: str
) -> None:
    job = asking_job(repo)
    with console(url) as client:
        page = client.get(f"/jobs/{job.id}").text
        for control in ('name="approve"', 'name="environment"', 'value="production"', 'value="staging"'):
            assert control in page
        csrf = csrf_of(page)
        wrong = client.post(
            f"/jobs/{job.id}/answer/q1", data={"csrf": csrf, "approve": "true", "environment": "moon"}
        )
        assert wrong.status_code == 422
        assert "q1.environment: must be one of [&#x27;staging&#x27;, &#x27;production&#x27;]" in wrong.text
        assert "nothing was stored" in wrong.text
        missing = client.post(f"/jobs/{job.id}/answer/q1", data={"csrf": csrf, "environment": "staging"})
        assert missing.status_code == 422 and "q1.approve: required" in missing.text
        pending = get_input(repo, job.id, "q1")
        assert pending is not None and pending.answered_at is None
        before = datetime.now(UTC)
        done = client.post(
            f"/jobs/{job.id}/answer/q1", data={"csrf": csrf, "approve": "true", "environment": "staging"}
        )
        assert done.status_code == 303
        shown = client.get(done.headers["location"]).text
        assert "Answered" in shown and "operator:alice" in shown
        again = client.post(
            f"/jobs/{job.id}/answer/q1", data={"csrf": csrf, "approve": "false", "environment": "production"}
        )
        assert again.status_code == 409 and "already answered" in again.text, "no second answer"
    answered = get_input(repo, job.id, "q1")
    assert answered is not None and answered.answer == {"approve": True, "environment": "staging"}
    assert answered.answered_by == "operator:alice"
    assert answered.answered_at is not None and answered.answered_at >= before - timedelta(seconds=1)
    after = repo.get(job.id)
    assert after is not None and after.status == Status.WORKING


def test_a_sensitive_answer_is_sealed_and_never_shown(
    repo: JobRepository, url: str, signing_key: str
) -> None:
    schema = {
        "type": "object",
        "properties": {"password": {"type": "string", "writeOnly": True}, "user": {"type": "string"}},
        "required": ["password"],
    }
    job = new_job(
        repo,
        kind="login",
        arguments={
            "host": "primary-host",
            "secret": Sealer([signing_key]).seal({"secret": "hunter2"}, frozenset({"secret"}))["secret"],
        },
    )
    assert claim(repo, job.id, OWNER, 30) is not None
    repo.open_input(job.id, OWNER, "q1", "Password?", schema)
    with console(url) as client:
        page = client.get(f"/jobs/{job.id}").text
        assert 'type="password"' in page
        client.post(
            f"/jobs/{job.id}/answer/q1", data={"csrf": csrf_of(page), "password": "s3cr3t-pw", "user": "root"}
        )
        revealed = client.get(f"/jobs/{job.id}", params={"reveal": "1"}).text
        assert "primary-host" in revealed and "root" in revealed, "revealed: arguments and answers"
        assert "[sensitive]" in revealed
        assert "s3cr3t-pw" not in revealed and "hunter2" not in revealed
        hidden = client.get(f"/jobs/{job.id}").text
        assert "primary-host" not in hidden and "root" not in hidden, "hidden until revealed"
    stored = get_input(repo, job.id, "q1")
    assert stored is not None and stored.answer is not None and is_sealed(stored.answer["password"])


def test_cancel_asks_for_confirmation_and_records_who_and_when(repo: JobRepository, url: str) -> None:
    queued = new_job(repo)
    running = claimed_job(repo)
    with console(url, signed_in_as="dana") as client:
        confirm = client.get(f"/jobs/{queued.id}/cancel")
        assert confirm.status_code == 200 and "Yes, cancel it" in confirm.text
        csrf = csrf_of(confirm.text)
        unconfirmed = client.post(f"/jobs/{queued.id}/cancel", data={"csrf": csrf})
        assert unconfirmed.status_code == 400
        still = repo.get(queued.id)
        assert still is not None and still.cancel_requested_at is None
        before = datetime.now(UTC)
        for job in (queued, running):
            reply = client.post(f"/jobs/{job.id}/cancel", data={"csrf": csrf, "confirm": "yes"})
            assert reply.status_code == 303
        shown = client.get(f"/jobs/{running.id}").text
        assert "Cancel requested" in shown and "operator:dana" in shown
    ended = repo.get(queued.id)
    assert ended is not None and ended.status == Status.CANCELLED
    signalled = repo.get(running.id)
    assert signalled is not None and signalled.status == Status.WORKING, "the node running it stops it"
    for job in (ended, signalled):
        assert job.cancel_requested_by == "operator:dana"
        assert job.cancel_requested_at is not None and job.cancel_requested_at >= before - timedelta(
            seconds=1
        )


def test_the_job_page_shows_steps_attempts_questions_and_the_error_reference(
    repo: JobRepository, url: str
) -> None:
    job = asking_job(repo)
    repo.begin_step(job.id, OWNER, "upload artifacts", 1)
    repo.finish_step(job.id, OWNER, "upload artifacts", result={"ok": True})
    repo.begin_step(job.id, OWNER, "switch traffic", 1)
    failed = claimed_job(repo, kind="export_dataset")
    repo.transition(
        failed.id,
        Status.FAILED,
        owner=OWNER,
        error={"error": "internal", "message": "It broke.", "reference": "abc123def456"},
    )
    with console(url) as client:
        page = client.get(f"/jobs/{job.id}").text
        for text in (
            "upload artifacts",
            "switch traffic",
            "outcome not recorded yet",
            OWNER,
            "Deploy 2.4.0?",
            "kept until",
        ):
            assert text in page, text
        broken = client.get(f"/jobs/{failed.id}").text
        assert "abc123def456" in broken and "It broke." in broken
        assert client.get("/jobs/no-such-job").status_code == 404


def test_the_overview_counts_jobs_per_kind_and_node(repo: JobRepository, url: str) -> None:
    new_job(repo, kind="generate_report")
    claimed_job(repo, kind="generate_report")
    claimed_job(repo, kind="export_dataset", owner=OTHER_OWNER)
    failed = claimed_job(repo, kind="export_dataset", owner=OTHER_OWNER)
    assert repo.transition(failed.id, Status.FAILED, owner=OTHER_OWNER, error={"error": "internal"})
    asking_job(repo)
    with console(url) as client:
        page = client.get("/overview").text
    rows = {
        kind: [int(n) for n in re.findall(r'<td class="num">(\d+)</td>', cells)]
        for kind, cells in re.findall(r"<tr><td><a [^>]*>([a-z_]+)</a></td>(.*?)</tr>", page)
    }
    # running, queued, parked, failed (1 h)
    assert rows == {
        "deploy_release": [0, 0, 1, 0],
        "export_dataset": [1, 0, 0, 1],
        "generate_report": [1, 1, 0, 0],
    }
    nodes = dict(re.findall(r'<td class="mono">([^<]+)</td><td class="num">(\d+)</td>', page))
    assert nodes == {OWNER: "1", OTHER_OWNER: "1"}
    assert "The oldest queued job has waited" in page


@pytest.mark.parametrize("token", ["", "short"])
def test_the_console_refuses_a_missing_or_short_token(url: str, token: str) -> None:
    from handles.console import console_app

    with pytest.raises(ValueError, match="at least 16 characters"):
        console_app(url, token=token)


def test_mounted_beside_mcp_it_serves_under_its_prefix_on_the_servers_store(
    tmp_path: Path, signing_key: str
) -> None:
    from starlette.testclient import TestClient

    from example_server.server import build_server, create_jobs
    from handles import streamable_http_app
    from handles.console import console_app
    from tests.support import handles_config

    jobs = create_jobs(handles_config(tmp_path, [signing_key]))
    app = streamable_http_app(build_server(jobs), jobs)
    app.mount("/console", console_app(jobs, token=TOKEN))
    with TestClient(app, follow_redirects=False) as client:
        job = new_job(jobs.service.store.repo, kind="generate_report")
        assert client.get("/console/").status_code == 401
        signed_in = client.post("/console/login", data={"token": TOKEN, "name": "ivy", "next": "/console/"})
        assert signed_in.status_code == 303 and signed_in.headers["location"] == "/console/"
        assert "path=/console" in signed_in.headers["set-cookie"].lower()
        page = client.get("/console/").text
        assert f'href="/console/jobs/{job.id}"' in page and 'data-feed="/console/api/jobs"' in page
        assert client.get("/healthz").status_code == 200, "the server's own routes are untouched"


def test_every_reply_forbids_inline_scripts_and_framing(repo: JobRepository, url: str) -> None:
    job = asking_job(repo)
    with console(url, signed_in_as=None) as anonymous:
        replies = [anonymous.get("/"), anonymous.get("/api/jobs"), anonymous.get("/live.js")]
    with console(url) as client:
        replies += [
            client.get("/"),
            client.get(f"/jobs/{job.id}"),
            client.get("/overview"),
            client.get("/api/jobs"),
        ]
        pages = [reply.text for reply in replies[3:6]]
    for reply in replies:
        policy = reply.headers["content-security-policy"]
        assert "script-src 'self';" in policy and "frame-ancestors 'none'" in policy, reply.url
        assert reply.headers["x-frame-options"] == "DENY" and reply.headers["cache-control"] == "no-store"
    assert all("<script>" not in text for text in pages), "no inline script: the policy would block it"
    assert '<script src="/live.js" defer></script>' in pages[0]
    assert "textContent" in replies[2].text and replies[2].headers["content-type"].startswith(
        "text/javascript"
    )


def test_a_running_jobs_node_shows_when_it_was_last_heard_from_and_when_another_takes_over(
    repo: JobRepository, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in (("LEASE", "30"), ("HEARTBEAT", "2"), ("SWEEP", "5")):
        monkeypatch.setenv(f"HANDLES_{name}_SECONDS", value)
    healthy = new_job(repo, kind="generate_report")
    assert claim(repo, healthy.id, OWNER, 30) is not None  # renewed just now
    quiet = new_job(repo, kind="export_dataset")
    assert claim(repo, quiet.id, OTHER_OWNER, 10) is not None  # as if last renewed 20 s ago
    stored = repo.get(quiet.id)
    assert stored is not None and stored.lease_expires_at is not None
    takeover = (stored.lease_expires_at + timedelta(seconds=5)).strftime("%H:%M:%S UTC")
    with console(url) as client:
        rows = {row["id"]: row for row in client.get("/api/jobs").json()["jobs"]}
        assert rows[healthy.id]["quiet"] is False and rows[healthy.id]["heard"].startswith("heard ")
        assert rows[quiet.id]["quiet"] is True
        assert re.fullmatch(
            rf"quiet (19|20|21) s; another node takes over by {takeover}", rows[quiet.id]["heard"]
        )
        listing = client.get("/").text
        assert '<div class="quiet">quiet ' in listing and f"takes over by {takeover}" in listing
        page = client.get(f"/jobs/{quiet.id}").text
        assert "Node last heard" in page and "Taken over by" in page and f"takes over by {takeover}" in page
        calm = client.get(f"/jobs/{healthy.id}").text
        assert "Node last heard" in calm and 'class="quiet"' not in calm
        ended = claimed_job(repo, kind="generate_report")
        assert repo.transition(ended.id, Status.COMPLETED, owner=OWNER, result={})
        assert "Node last heard" not in client.get(f"/jobs/{ended.id}").text
