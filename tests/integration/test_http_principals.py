"""Streamable HTTP with two bearer tokens: a handle is bound to the principal that started its job.

The example server runs as a subprocess with `--tokens` (the SDK's token verifier);
`as_principal(name)` connects the official client with that principal's token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx2

from handles.handle import HandleCodec
from tests.support import (
    LOCAL_PRINCIPAL,
    HttpExampleServer,
    ToolClient,
    expired_twin,
    token_of,
    token_principal,
)

HANDLE_TOOLS = ["generate_report_progress", "generate_report_fetch", "generate_report_cancel"]


async def start(client: ToolClient, job: str, **arguments: object) -> str:
    reply = await client.call(f"{job}_start", arguments)
    assert not reply.is_error, reply.data
    return str(reply["handle"])


async def test_requests_without_a_valid_token_are_refused(http_auth_example: HttpExampleServer) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    async with httpx2.AsyncClient(timeout=10) as http:
        anonymous = await http.post(http_auth_example.url, json=body, headers=headers)
        wrong = await http.post(
            http_auth_example.url, json=body, headers={**headers, "Authorization": "Bearer not-a-token"}
        )
    assert anonymous.status_code == 401
    assert wrong.status_code == 401


async def test_another_principals_handle_gets_the_same_answer_as_a_made_up_one(
    as_principal: Callable[[str], Any], signing_key: str
) -> None:
    async with as_principal("alice") as alice, as_principal("bob") as bob:
        report = await start(alice, "generate_report", account="acme", months=2)
        deploy = await start(alice, "deploy_release", version="3.0.0")
        for tool, handle, extra in [
            *((tool, report, {}) for tool in HANDLE_TOOLS),
            ("deploy_release_progress", deploy, {}),
            (
                "deploy_release_respond",
                deploy,
                {"responses": {"q1": {"approve": True, "environment": "production"}}},
            ),
            # Bob may not even learn that the handle belongs to another job kind.
            ("export_dataset_progress", report, {}),
        ]:
            stolen = await bob.call(tool, {"handle": handle, **extra})
            made_up = await bob.call(tool, {"handle": "not-a-real-handle", **extra})
            assert stolen.is_error and stolen["error"] == "unknown_handle", tool
            assert stolen.text == made_up.text, f"{tool}: another principal's handle must look made up"
        # An expired handle of Alice's is also just unknown to Bob (expiry is Alice's business).
        expired = expired_twin(report, signing_key, token_principal("alice"))
        reply = await bob.call("generate_report_fetch", {"handle": expired})
        assert reply["error"] == "unknown_handle"
        mine = await alice.call("generate_report_fetch", {"handle": expired})
        assert mine["error"] == "expired_handle"

        # Nothing Bob did touched Alice's jobs: the report completes, the deployment still waits for Alice.
        done = await alice.call("generate_report_fetch", {"handle": report, "wait_seconds": 20})
        assert done["status"] == "completed" and done["result"]["account"] == "acme"
        asked = await alice.wait_status("deploy_release", deploy, "input_required")
        assert list(asked["input_requests"]) == ["q1"]
        cancelled = await alice.call("deploy_release_cancel", {"handle": deploy})
        assert cancelled["cancel_requested"] is True


async def test_idempotency_keys_are_per_principal(as_principal: Callable[[str], Any]) -> None:
    async with as_principal("alice") as alice, as_principal("bob") as bob:
        arguments = {"rows": 10, "idempotency_key": "nightly-export"}
        first = await alice.call("export_dataset_start", arguments)
        again = await alice.call("export_dataset_start", arguments)
        other = await bob.call("export_dataset_start", arguments)
        assert first["created"] is True and again["created"] is False and again["handle"] == first["handle"]
        assert other["created"] is True and other["handle"] != first["handle"]
        conflict = await bob.call("export_dataset_start", {**arguments, "rows": 11})
        assert conflict["error"] == "idempotency_conflict"


async def test_the_principal_comes_from_the_token_not_from_arguments(
    as_principal: Callable[[str], Any], signing_key: str
) -> None:
    """The handle of a job started with Alice's token names Alice's principal, whatever the arguments say."""
    async with as_principal("alice") as alice:
        handle = await start(alice, "generate_report", account="bob", months=1)
    codec = HandleCodec([signing_key])
    assert codec.verify(handle, principal=token_principal("alice")) is not None
    assert codec.verify(handle, principal=token_principal("bob")) is None
    assert codec.verify(handle, principal=LOCAL_PRINCIPAL) is None
    assert token_of("alice") not in handle and "alice" not in handle
