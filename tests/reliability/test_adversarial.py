"""Gate: no cross-tenant access. Every way of presenting a handle that is not the caller's own gets
the answer a made-up handle gets (same code, same words, similar timing), on every handle tool and
every tasks/* method; sizes are enforced at their exact limits; malformed tasks/* params get clear
JSON-RPC errors.

Alice owns the jobs; Bob attacks them over the same server. Every request is a real Streamable HTTP
POST (raw JSON-RPC, so the exact wire answer is compared) through the scanning relay.
"""

from __future__ import annotations

import asyncio
import base64
import json
import statistics
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx2
import pytest

from handles.config import HandlesConfig
from handles.handle import HandleCodec
from handles.jobs import JobSpec
from handles.limits import (
    MAX_ARGUMENTS_BYTES,
    MAX_IDEMPOTENCY_KEY,
    MAX_RESPONSE_BYTES,
    json_size,
)
from handles.outcomes import result_to_json
from handles.server.tasks_extension import UNKNOWN_TASK
from tests.reliability import app
from tests.reliability.conftest import (
    CURRENT_KEY,
    MAX_RESULT_FILE_BYTES,
    PREVIOUS_KEY,
    RETIRED_KEY,
    TOKENS,
    Deployment,
    principal,
    token,
)
from tests.reliability.support import RawReply, raw_call, report
from tests.support import tampered_handles

pytestmark = pytest.mark.timeout(120)

MADE_UP = "not-a-real-handle"
HANDLE_TOOLS = {
    "charge": ["charge_progress", "charge_fetch", "charge_cancel"],
    "approve": ["approve_progress", "approve_fetch", "approve_cancel", "approve_respond"],
}
TASK_METHODS = ["tasks/get", "tasks/update", "tasks/cancel"]


class Wire:
    """Raw requests as one principal, on a kept-alive connection through the relay."""

    def __init__(self, http: httpx2.AsyncClient, url: str, name: str) -> None:
        self.http, self.url, self.name = http, url, name

    async def tool(self, name: str, arguments: dict[str, Any], **options: Any) -> RawReply:
        return await raw_call(
            self.http,
            self.url,
            "tools/call",
            {"name": name, "arguments": arguments},
            token=token(self.name),
            **options,
        )

    async def body(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        reply = await self.tool(name, arguments)
        assert reply.status == 200, reply.raw[:500]
        return reply.tool_body()

    async def task(self, method: str, task_id: Any, **extra: Any) -> RawReply:
        params: dict[str, Any] = {"taskId": task_id, **extra}
        if method == "tasks/update":
            params.setdefault("inputResponses", {"q1": {"action": "accept", "content": {"approve": True}}})
        return await raw_call(self.http, self.url, method, params, token=token(self.name))


@pytest.fixture
async def wires(deployment: Deployment) -> AsyncIterator[tuple[Wire, Wire]]:
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=60)) as http:
        yield Wire(http, deployment.url, "alice"), Wire(http, deployment.url, "bob")


def tool_arguments(tool: str, handle: Any) -> dict[str, Any]:
    arguments: dict[str, Any] = {"handle": handle}
    if tool.endswith("_respond"):
        arguments["responses"] = {"q1": {"approve": True, "note": "bob was here"}}
    return arguments


async def alice_jobs(alice: Wire) -> dict[str, str]:
    """A working charge job and an approve job waiting in input_required, both Alice's."""
    charge = (await alice.body("charge_start", {"n": 1, "hold": 60}))["handle"]
    approve = (await alice.body("approve_start", {"version": "9"}))["handle"]
    for _ in range(200):
        if (await alice.body("approve_progress", {"handle": approve}))["status"] == "input_required":
            break
        await asyncio.sleep(0.05)
    return {"charge": charge, "approve": approve}


def re_encoded(handle: str) -> str:
    """The same claims with different JSON spacing, under the original signature."""
    payload, _, signature = handle.rpartition(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    spaced = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{spaced}.{signature}"


def variants(handle: str, kind: str) -> dict[str, str]:
    """Every handle Bob might present for Alice's job, or invent."""
    claims = HandleCodec([CURRENT_KEY]).verify(handle, principal=principal("alice"))
    assert claims is not None
    alice = principal("alice")

    def mint(keys: list[str], **changes: Any) -> str:
        fields = {"job_id": claims.job_id, "kind": kind, "principal": alice, "expires_at": claims.expires_at}
        fields.update(changes)
        return HandleCodec(keys).mint(**fields)

    return {
        "alices_own": handle,
        "alices_signed_by_previous_key": mint([PREVIOUS_KEY]),
        "alices_signed_by_retired_key": mint([RETIRED_KEY]),
        "alices_expired": mint([CURRENT_KEY], expires_at=datetime.now(UTC) - timedelta(hours=1)),
        "alices_for_another_kind": mint([CURRENT_KEY], kind="slow"),
        "bobs_principal_retired_key": mint([RETIRED_KEY], principal=principal("bob")),
        "re_encoded": re_encoded(handle),
        "whitespace_inside": handle[:10] + " " + handle[10:],
        **{name: value for name, value in tampered_handles(handle).items() if isinstance(value, str)},
    }


async def test_bob_gets_the_made_up_answer_for_every_variant_of_alices_handles_on_every_tool(
    wires: tuple[Wire, Wire],
) -> None:
    alice, bob = wires
    handles = await alice_jobs(alice)
    tried = 0
    for kind, tools in HANDLE_TOOLS.items():
        for tool in tools:
            reference = await bob.tool(tool, tool_arguments(tool, MADE_UP))
            made_up = reference.result["content"][0]["text"]
            assert reference.result["isError"] is True and json.loads(made_up)["error"] == "unknown_handle"
            for name, bad in variants(handles[kind], kind).items():
                reply = await bob.tool(tool, tool_arguments(tool, bad))
                assert reply.status == 200 and reply.result["isError"] is True, (tool, name)
                assert "structuredContent" not in reply.result or reply.result["structuredContent"] is None
                assert reply.result["content"][0]["text"] == made_up, (
                    f"{tool} with {name} differs from made up"
                )
                tried += 1
    # Nothing Bob did reached Alice's jobs.
    charge = await alice.body("charge_progress", {"handle": handles["charge"]})
    approve = await alice.body("approve_progress", {"handle": handles["approve"]})
    assert charge["status"] == "working" and approve["status"] == "input_required"
    assert list(approve["input_requests"]) == ["q1"]
    cancel = await alice.body("charge_cancel", {"handle": handles["charge"]})
    assert cancel["next"].startswith("Cancellation was requested"), "Bob's cancels never landed"
    await alice.body("approve_cancel", {"handle": handles["approve"]})
    assert tried == 7 * 23  # 19 variants, plus 3 re-spellings of the last character and junk in the signature


async def test_bob_reading_alices_result_link_gets_the_made_up_answer(wires: tuple[Wire, Wire]) -> None:
    """A large result's link is re-authorized on every read: Bob holding Alice's link (whole, a part, a
    re-spelling) gets the answer of a link that never existed, and learns nothing; Alice reads it."""
    alice, bob = wires
    started = await alice.body("sized_start", {"nbytes": 1_200_000})
    done = await alice.body("sized_fetch", {"handle": started["handle"], "wait_seconds": 10})
    link = done["result_link"]
    assert link["parts"] == 2

    async def read(wire: Wire, uri: str) -> RawReply:
        return await raw_call(wire.http, wire.url, "resources/read", {"uri": uri}, token=token(wire.name))

    job_id, file_id = link["uri"].split("/")[-2:]
    made_up = f"handles://results/{'A' * len(job_id)}/{'0' * 32}"
    reference = await read(bob, made_up)
    assert reference.error["code"] == -32602
    expected = reference.error["message"].replace(made_up, "<uri>")
    for uri in (
        f"{link['uri']}/parts/0",
        f"{link['uri']}/parts/1",
        link["uri"],
        f"{link['uri']}/parts/2",
        link["uri"].upper(),
        link["uri"].replace(file_id, file_id[::-1]),
    ):
        reply = await read(bob, uri)
        assert reply.status == reference.status and reply.error["code"] == -32602, uri
        assert reply.error["message"].replace(uri, "<uri>") == expected, uri
        assert "blob" not in reply.raw and "part" not in reply.error.get("data", {}), uri
    mine = await read(alice, f"{link['uri']}/parts/1")
    assert mine.result["contents"][0]["_meta"]["part"] == 1


async def test_bob_gets_the_unknown_task_error_for_every_variant_on_every_tasks_method(
    wires: tuple[Wire, Wire],
) -> None:
    alice, bob = wires
    handles = await alice_jobs(alice)
    for method in TASK_METHODS:
        reference = await bob.task(method, MADE_UP)
        assert reference.status == 400 and reference.error == {"code": -32602, "message": UNKNOWN_TASK}
        for kind, handle in handles.items():
            for name, bad in variants(handle, kind).items():
                reply = await bob.task(method, bad)
                assert reply.status == 400, (method, name, reply.raw[:300])
                if name == "empty":
                    assert reply.error["code"] == -32602  # not a task id at all; its own message
                    continue
                assert reply.error == reference.error, f"{method} with {kind}/{name}: {reply.error}"
    # Alice's own tasks are untouched, and her previous-key handle still works on the Tasks face.
    assert (await alice.task("tasks/get", handles["charge"])).result["status"] == "working"
    got = (
        await alice.task(
            "tasks/get", variants(handles["approve"], "approve")["alices_signed_by_previous_key"]
        )
    ).result
    assert got["status"] == "input_required" and set(got["inputRequests"]) == {"q1"}
    for handle in handles.values():
        await alice.task("tasks/cancel", handle)


async def test_alices_own_handle_of_another_kind_says_so_but_bobs_copy_does_not(
    wires: tuple[Wire, Wire],
) -> None:
    alice, bob = wires
    handle = (await alice.body("quick_start", {"x": 1}))["handle"]
    own = await alice.body("charge_progress", {"handle": handle})
    assert own["error"] == "wrong_job" and "quick" in own["message"]
    foreign = await bob.body("charge_progress", {"handle": handle})
    assert foreign["error"] == "unknown_handle" and "quick" not in json.dumps(foreign)


async def test_refusing_another_principals_handle_takes_as_long_as_refusing_a_made_up_one(
    wires: tuple[Wire, Wire],
) -> None:
    alice, bob = wires
    handles = await alice_jobs(alice)
    retired = variants(handles["charge"], "charge")["alices_signed_by_retired_key"]
    kinds = {"foreign": handles["charge"], "made_up": MADE_UP, "retired": retired}
    faces = {
        "handle tool": lambda handle: bob.tool("charge_progress", {"handle": handle}),
        "tasks/get": lambda handle: bob.task("tasks/get", handle),
    }
    for face, send in faces.items():
        samples: dict[str, list[float]] = {name: [] for name in kinds}
        for _ in range(3):  # warm up the connection and the server's caches
            await send(MADE_UP)
        for _ in range(40):  # interleaved, so drift on a busy machine hits every kind alike
            for name, handle in kinds.items():
                samples[name].append((await send(handle)).seconds)
        medians = {name: statistics.median(values) for name, values in samples.items()}
        slack = max(0.002, 0.3 * medians["made_up"])
        assert abs(medians["foreign"] - medians["made_up"]) <= slack, (face, medians)
        assert abs(medians["retired"] - medians["made_up"]) <= slack, (face, medians)
        report(
            f"refusal timing ({face})", {k: round(v * 1000, 2) for k, v in medians.items()} | {"samples": 40}
        )
    for handle in handles.values():
        await alice.task("tasks/cancel", handle)


# -- credentials that lose their access ---------------------------------------------------------------


async def test_a_revoked_or_reassigned_credential_loses_the_jobs_at_once(
    deployment: Deployment, wires: tuple[Wire, Wire]
) -> None:
    carol = Wire(wires[0].http, deployment.url, "carol")  # the same kept-alive connection, Carol's token
    handle = (await carol.body("slow_start", {"seconds": 20}))["handle"]
    assert (await carol.body("slow_progress", {"handle": handle}))["status"] == "working"
    server = deployment.server
    try:
        server.write_tokens({value: name for value, name in TOKENS.items() if name != "carol"})
        for reply in (
            await carol.tool("slow_progress", {"handle": handle}),
            await carol.task("tasks/get", handle),
            await carol.tool("slow_start", {"seconds": 1}),
        ):
            assert reply.status == 401, reply.raw[:300]
            assert "slow" not in reply.raw and handle not in reply.raw
        # The same token string handed to someone else: the handle is not theirs.
        server.write_tokens({**{v: n for v, n in TOKENS.items() if n != "carol"}, token("carol"): "mallory"})
        stolen = await carol.body("slow_progress", {"handle": handle})
        assert stolen["error"] == "unknown_handle"
        assert (await carol.task("tasks/cancel", handle)).error["code"] == -32602
    finally:
        server.write_tokens(dict(TOKENS))
    # Access restored: the job was never touched by the refused requests.
    back = await carol.body("slow_progress", {"handle": handle})
    assert back["status"] == "working"
    await carol.body("slow_cancel", {"handle": handle})


# -- sizes at and past the limits -------------------------------------------------------------------------


def noisy_arguments_of_size(size: int) -> dict[str, Any]:
    """Arguments of `noisy` whose JSON (as the server sees it, defaults filled in) is exactly `size` bytes."""
    base = {"message": "", "ask": False, "hold": 0.0}
    return {**base, "message": "m" * (size - json_size(base))}


async def test_argument_response_result_and_key_sizes_are_enforced_at_their_exact_limits(
    wires: tuple[Wire, Wire], deployment: Deployment
) -> None:
    alice, _ = wires
    at_limit = await alice.body("noisy_start", noisy_arguments_of_size(MAX_ARGUMENTS_BYTES))
    assert "handle" in at_limit, at_limit
    over = await alice.body("noisy_start", noisy_arguments_of_size(MAX_ARGUMENTS_BYTES + 1))
    assert over["error"] == "invalid_arguments" and over["size_bytes"] == MAX_ARGUMENTS_BYTES + 1
    task_over = await alice.tool("noisy", noisy_arguments_of_size(MAX_ARGUMENTS_BYTES + 1))
    assert task_over.result["isError"] is True and "taskId" not in task_over.result
    huge = await alice.tool("noisy_start", {"message": "h" * 3_000_000})
    assert huge.status < 500 and (huge.status != 200 or huge.result["isError"] is True)

    ok_key = await alice.body("quick_start", {"x": 1, "idempotency_key": "k" * MAX_IDEMPOTENCY_KEY})
    assert ok_key["created"] is True
    for bad_key in ("k" * (MAX_IDEMPOTENCY_KEY + 1), ""):
        refused = await alice.body("quick_start", {"x": 1, "idempotency_key": bad_key})
        assert refused["error"] == "invalid_arguments", bad_key

    # Answers: the whole `responses` object may be MAX_RESPONSE_BYTES of JSON.
    handle = (await alice.body("approve_start", {"version": "sizes"}))["handle"]
    for _ in range(200):
        if (await alice.body("approve_progress", {"handle": handle}))["status"] == "input_required":
            break
        await asyncio.sleep(0.05)
    shell = {"q1": {"approve": True, "note": ""}}
    fill = MAX_RESPONSE_BYTES - json_size(shell)
    too_big = {"q1": {"approve": True, "note": "n" * (fill + 1)}}
    refused = await alice.body("approve_respond", {"handle": handle, "responses": too_big})
    assert refused["error"] == "invalid_arguments" and refused["size_bytes"] == MAX_RESPONSE_BYTES + 1
    update = await alice.task(
        "tasks/update",
        handle,
        inputResponses={
            "q1": {"action": "accept", "content": too_big["q1"] | {"note": "n" * MAX_RESPONSE_BYTES}}
        },
    )
    assert update.status == 400 and update.error["code"] == -32602
    assert (await alice.body("approve_progress", {"handle": handle}))["status"] == "input_required"
    fits = {"q1": {"approve": True, "note": "n" * fill}}
    taken = await alice.body("approve_respond", {"handle": handle, "responses": fits})
    assert taken["accepted"] == ["q1"]
    done = await alice.body("approve_fetch", {"handle": handle, "wait_seconds": 10})
    assert done["status"] == "completed" and len(done["result"]["note"]) == fill

    # Results: up to the link threshold a stored CallToolResult travels inline; one byte more and it is
    # stored as a file and answered as a link; a file past HANDLES_MAX_RESULT_FILE_BYTES fails the job.
    spec = JobSpec.from_function(app.sized)
    threshold = HandlesConfig.link_results_over

    def stored_size(n: int) -> int:
        return json_size(result_to_json(spec.to_tool_result(app.Blob(blob="x" * n))))

    n = (threshold - stored_size(0)) // 2
    while stored_size(n + 1) <= threshold:
        n += 1
    kept = await alice.body("sized_start", {"nbytes": n})
    kept_done = await alice.body("sized_fetch", {"handle": kept["handle"], "wait_seconds": 10})
    assert kept_done["status"] == "completed" and len(kept_done["result"]["blob"]) == n
    assert kept_done["result_link"] is None
    linked = await alice.body("sized_start", {"nbytes": n + 1})
    linked_done = await alice.body("sized_fetch", {"handle": linked["handle"], "wait_seconds": 10})
    assert linked_done["status"] == "completed" and linked_done["result"] is None
    link = linked_done["result_link"]
    assert link["media_type"] == "application/json" and link["parts"] == 1
    read = await raw_call(alice.http, alice.url, "resources/read", {"uri": link["uri"]}, token=token("alice"))
    assert json.loads(read.result["contents"][0]["text"]) == {"blob": "x" * (n + 1)}
    dropped = await alice.body("sized_start", {"nbytes": MAX_RESULT_FILE_BYTES})
    dropped_done = await alice.body("sized_fetch", {"handle": dropped["handle"], "wait_seconds": 10})
    assert (
        dropped_done["status"] == "failed" and dropped_done["error"]["data"]["reason"] == "result_too_large"
    )
    assert dropped_done["result"] is None
    await alice.body("noisy_cancel", {"handle": at_limit["handle"]})


# -- malformed tasks/* params -------------------------------------------------------------------------------

MALFORMED: list[tuple[str, Any]] = [
    ("tasks/get", None),
    ("tasks/get", []),
    ("tasks/get", "task"),
    ("tasks/get", {}),
    ("tasks/get", {"taskId": None}),
    ("tasks/get", {"taskId": 7}),
    ("tasks/get", {"taskId": ["a"]}),
    ("tasks/get", {"taskId": {"id": "a"}}),
    ("tasks/get", {"taskId": True}),
    ("tasks/get", {"taskId": ""}),
    ("tasks/get", {"taskId": "x" * 100_000}),
    ("tasks/get", {"taskId": "\u0000\u202e"}),
    ("tasks/get", {"taskId": "a", "extra": {"deep": [1, 2, 3]}}),
    ("tasks/cancel", {"taskId": 3.5}),
    ("tasks/cancel", {}),
    ("tasks/update", {"taskId": "a"}),
    ("tasks/update", {"taskId": "a", "inputResponses": None}),
    ("tasks/update", {"taskId": "a", "inputResponses": []}),
    ("tasks/update", {"taskId": "a", "inputResponses": "accept"}),
    ("tasks/update", {"inputResponses": {}}),
    ("tasks/update", {"taskId": None, "inputResponses": {"q1": {"action": "accept"}}}),
]


@pytest.mark.parametrize(
    ("method", "params"), MALFORMED, ids=[f"{m}-{i}" for i, (m, _) in enumerate(MALFORMED)]
)
async def test_malformed_tasks_params_get_a_clear_jsonrpc_error(
    deployment: Deployment, method: str, params: Any
) -> None:
    async with httpx2.AsyncClient(timeout=30) as http:
        reply = await raw_call(http, deployment.url, method, params, token=token("alice"), add_meta=False)
        if isinstance(params, dict):
            enveloped = await raw_call(http, deployment.url, method, params, token=token("alice"))
        else:
            enveloped = reply
    for answer in (reply, enveloped):
        assert 400 <= answer.status < 500, (answer.status, answer.raw[:300])
        assert answer.error["code"] in {-32600, -32602, -32020, -32021, -32022}, answer.error
        assert answer.error["message"] and "Internal" not in answer.error["message"]


async def test_tasks_update_answers_for_a_real_question_are_checked(wires: tuple[Wire, Wire]) -> None:
    alice, _ = wires
    handle = (await alice.body("approve_start", {"version": "shape"}))["handle"]
    for _ in range(200):
        if (await alice.body("approve_progress", {"handle": handle}))["status"] == "input_required":
            break
        await asyncio.sleep(0.05)
    for responses in (
        {"q1": "accept"},
        {"q1": {"action": "maybe"}},
        {"q1": {"action": "accept", "content": []}},
        {"q1": {"action": "accept", "content": {"approve": "yes"}}},
        {"q1": {"action": "accept", "content": {"approve": True, "surprise": 1}}},
        {"q1": {"action": "accept", "content": {"approve": True, "note": 5}}},
    ):
        reply = await alice.task("tasks/update", handle, inputResponses=responses)
        assert reply.status == 400 and reply.error["code"] == -32602, (responses, reply.raw[:300])
    still = await alice.body("approve_progress", {"handle": handle})
    assert still["status"] == "input_required" and list(still["input_requests"]) == ["q1"]
    await alice.task("tasks/cancel", handle)
