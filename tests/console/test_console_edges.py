"""`handles console` over real HTTP: bad input gets a 4xx, never a 500, and wrong tokens are throttled.

One console process for the module, on an SQLite file. Each test speaks from loopback addresses of its
own (127.0.0.x, bound as the client's local address), so the console sees separate clients and one
test's throttled address never touches another's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx2 as httpx
import pytest

from handles.console.throttle import BLOCK_SECONDS, FAILURES_ALLOWED
from handles.states import Status
from handles.store import JobRecord, JobRepository
from tests.cli.test_cli import KEY
from tests.console.support import TOKEN, console_process
from tests.harness.process import ServerProcess
from tests.store.test_repository_contract import new_job
from tests.support import free_port


class Console:
    """The running console, its store, and a job in it."""

    def __init__(self, process: ServerProcess, repo: JobRepository, job: JobRecord) -> None:
        self.process, self.repo, self.job = process, repo, job

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.process.port}"

    def client(self, address: str) -> httpx.Client:
        """An HTTP client whose connections come from `address` (a loopback address: 127.0.0.x)."""
        return httpx.Client(
            base_url=self.base,
            transport=httpx.HTTPTransport(local_address=address),
            follow_redirects=False,
            timeout=10,
        )

    @contextmanager
    def signed_in(self, address: str, name: str = "alice") -> Iterator[httpx.Client]:
        """A client from `address` signed in through the login form as `name`."""
        with self.client(address) as client:
            reply = login(client, TOKEN, name)
            assert reply.status_code == 303, reply.text
            yield client


def login(client: httpx.Client, token: str, name: str = "mallory") -> httpx.Response:
    return client.post("/login", data={"token": token, "name": name, "next": "/"})


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    data = tmp_path_factory.mktemp("console-edges")
    repo = JobRepository(f"sqlite:///{(data / 'handles.db').as_posix()}")
    repo.prepare(auto_migrate=True)
    job = new_job(repo, kind="generate_report")
    process = console_process(data, [KEY], free_port()).start()
    try:
        yield Console(process, repo, job)
    finally:
        process.stop()
        repo.dispose()


def test_a_csrf_token_that_is_not_ascii_is_refused_with_403(running: Console) -> None:
    with running.signed_in("127.0.0.2") as client:
        for csrf in ("é" * 64, "ä", "\u2603" + "0" * 63):
            reply = client.post(f"/jobs/{running.job.id}/cancel", data={"confirm": "yes", "csrf": csrf})
            assert reply.status_code == 403, (csrf, reply.status_code, reply.text)
            assert "CSRF" in reply.text
        assert client.post("/logout", data={"csrf": "ü" * 10}).status_code == 403
    stored = running.repo.get(running.job.id)
    assert stored is not None and stored.cancel_requested_at is None and stored.status == Status.WORKING
    assert "Traceback" not in running.process.log()


def test_a_session_cookie_that_is_not_ascii_is_refused_with_401(running: Console) -> None:
    with running.client("127.0.0.3") as client:
        for cookie in ("eyJuYW1lIjoiZXZlIn0.\xc3\xa9\xc3\xa9", "\xc3\xa9.\xc3\xa9"):
            reply = client.get(
                "/api/jobs", headers=[(b"cookie", b"handles_console=" + cookie.encode("latin-1"))]
            )
            assert reply.status_code == 401, (cookie, reply.status_code, reply.text)
        bearer = client.get("/api/jobs", headers=[(b"authorization", "Bearer é-token".encode())])
        assert bearer.status_code == 401
    assert "Traceback" not in running.process.log()


def throttle_warnings(process: ServerProcess, address: str) -> list[str]:
    return [line for line in process.log().splitlines() if "WARNING" in line and address in line]


def test_wrong_tokens_from_one_client_are_throttled_and_logged_once(running: Console) -> None:
    attacker, bystander = "127.0.0.4", "127.0.0.5"
    with running.client(attacker) as client:
        for _ in range(FAILURES_ALLOWED):
            assert login(client, "not-the-token-" + "x" * 20).status_code == 401
        throttled = [login(client, f"guess-{n}-" + "x" * 20) for n in range(20)]
        for reply in throttled:
            assert reply.status_code == 429, reply.text
            assert 0 < int(reply.headers["retry-after"]) <= BLOCK_SECONDS
            assert "Too many wrong tokens" in reply.text
        # While throttled, the token is not checked at all: the right one is refused too, so guessing
        # on through the block learns nothing.
        right = login(client, TOKEN, "mallory")
        assert right.status_code == 429 and "handles_console" not in right.headers.get("set-cookie", "")
        bearer = client.get("/api/jobs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert bearer.status_code == 429 and "retry-after" in bearer.headers
        assert bearer.json()["error"] == "throttled"
    # Anyone else signs in as usual, with the form or the bearer token.
    with running.signed_in(bystander, "bob") as other:
        assert other.get("/api/jobs").status_code == 200
    with running.client(bystander) as script:
        feed = script.get("/api/jobs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert feed.status_code == 200 and [row["id"] for row in feed.json()["jobs"]] == [running.job.id]
    warnings = throttle_warnings(running.process, attacker)
    assert len(warnings) == 1, warnings
    assert f"{FAILURES_ALLOWED} wrong operator tokens" in warnings[0]
    assert throttle_warnings(running.process, bystander) == []


def test_wrong_bearer_tokens_count_as_failures_too(running: Console) -> None:
    guesser = "127.0.0.6"
    with running.client(guesser) as script:
        replies = [
            script.get("/api/jobs", headers={"Authorization": f"Bearer guess-{n}-" + "y" * 20})
            for n in range(FAILURES_ALLOWED + 3)
        ]
    assert [r.status_code for r in replies] == [401] * FAILURES_ALLOWED + [429] * 3
    assert len(throttle_warnings(running.process, guesser)) == 1


def test_a_signed_in_session_goes_on_while_its_address_is_throttled(running: Console) -> None:
    shared = "127.0.0.7"  # an operator and a guesser behind one address (a NAT, a proxy)
    with running.signed_in(shared, "carol") as operator, running.client(shared) as guesser:
        for _ in range(FAILURES_ALLOWED + 1):
            login(guesser, "not-the-token-" + "z" * 20)
        assert login(guesser, "another-guess-" + "z" * 20).status_code == 429
        assert operator.get("/api/jobs").status_code == 200, "a session is not a token guess"
