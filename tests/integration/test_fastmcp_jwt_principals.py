"""Principals from FastMCP's own authentication: signed JWTs verified by FastMCP's `JWTVerifier`.

The example's jobs on a FastMCP 4 server (`build_fastmcp_server(jobs, auth=JWTVerifier(...))`), served
over Streamable HTTP by `handles.streamable_http_app`. Two users of the same OAuth client
(`client_id`) are two principals: the stored principal is the token's issuer, client and subject,
so Bob, signed in through the same application as Alice, gets for her handle and her task id
exactly what a made-up one gets.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest
from fastmcp.server.auth.providers.jwt import JWTVerifier, RSAKeyPair

from example_server.server import build_fastmcp_server, create_jobs
from handles import streamable_http_app
from handles.principal import token_form
from handles.store import JobRepository
from tests.support import connect, free_port, handles_config, job_id_of
from tests.tasks.wire import ThreadedServer, Wire

pytestmark = pytest.mark.timeout(120)

ISSUER = "https://login.example.test"
AUDIENCE = "handles-example"
CLIENT = "shared-desktop-app"


@dataclass
class JwtServer:
    url: str
    keys: RSAKeyPair
    data_dir: Path
    signing_key: str

    def token(self, subject: str, *, issuer: str = ISSUER) -> str:
        return self.keys.create_token(
            subject=subject, issuer=issuer, audience=AUDIENCE, additional_claims={"client_id": CLIENT}
        )


@pytest.fixture(scope="module")
def jwt_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JwtServer]:
    data_dir = tmp_path_factory.mktemp("fastmcp-jwt")
    signing_key = "fastmcp-jwt-signing-key-" + "j" * 32
    keys = RSAKeyPair.generate()
    port = free_port()
    verifier = JWTVerifier(
        public_key=keys.public_key, issuer=ISSUER, audience=AUDIENCE, base_url=f"http://127.0.0.1:{port}"
    )
    jobs = create_jobs(handles_config(data_dir, [signing_key]))
    server = ThreadedServer(
        streamable_http_app(build_fastmcp_server(jobs, auth=verifier), jobs), port
    ).start()
    try:
        yield JwtServer(server.url, keys, data_dir, signing_key)
    finally:
        server.stop()


async def test_a_token_fastmcp_does_not_verify_is_refused_before_any_tool(jwt_server: JwtServer) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    forged = jwt_server.token("alice", issuer="https://elsewhere.test")
    async with httpx2.AsyncClient(timeout=10) as http:
        anonymous = await http.post(jwt_server.url, json=body, headers=headers)
        foreign = await http.post(
            jwt_server.url, json=body, headers={**headers, "Authorization": f"Bearer {forged}"}
        )
    assert anonymous.status_code == 401
    assert foreign.status_code == 401


async def test_two_users_of_one_client_are_two_principals(jwt_server: JwtServer) -> None:
    alice_token, bob_token = jwt_server.token("alice"), jwt_server.token("bob")
    async with (
        connect(jwt_server.url, token=alice_token, forbidden=[jwt_server.signing_key]) as alice,
        connect(jwt_server.url, token=bob_token, forbidden=[jwt_server.signing_key]) as bob,
    ):
        started = await alice.call("generate_report_start", {"account": "acme", "months": 2})
        handle = str(started["handle"])
        made_up = await bob.call("generate_report_progress", {"handle": handle[:-4] + "AAAA"})
        foreign = await bob.call("generate_report_progress", {"handle": handle})
        assert foreign.is_error and made_up.is_error
        assert foreign.data == made_up.data, "another principal's handle reads exactly like a made-up one"
        assert foreign["error"] == "unknown_handle"
        own = await alice.call("generate_report_fetch", {"handle": handle, "wait_seconds": 30})
        assert own["status"] == "completed" and own["result"]["account"] == "acme"

    alice_principal = token_form(ISSUER, CLIENT, "alice")
    repo = JobRepository(f"sqlite:///{(jwt_server.data_dir / 'handles.db').as_posix()}")
    try:
        job = repo.get(job_id_of(handle, jwt_server.signing_key, alice_principal))
    finally:
        repo.dispose()
    assert job is not None and job.principal == alice_principal


async def test_bobs_tasks_get_of_alices_task_is_the_unknown_task_answer(jwt_server: JwtServer) -> None:
    async with httpx2.AsyncClient(timeout=30) as http:
        wire = Wire(jwt_server.url, http)
        alice, bob = jwt_server.token("alice"), jwt_server.token("bob")
        created = await wire.tool("generate_report", {"account": "acme", "months": 1}, token=alice)
        task_id = created.result["taskId"]
        foreign = await wire.get(task_id, token=bob)
        made_up = await wire.get(task_id[:-4] + "AAAA", token=bob)
        assert foreign.status == made_up.status == 400
        assert foreign.error == made_up.error and foreign.error["code"] == -32602
        assert (await wire.until(task_id, {"completed"}, token=alice))["status"] == "completed"
