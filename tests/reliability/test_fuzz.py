"""Fuzzing: every generated tool's arguments and every tasks/* params get a clear error or a valid
answer, never a crash (HTTP 5xx, JSON-RPC -32603, or the SDK's bare "Error executing tool X" that
stands for an exception nobody handled).

hypothesis draws arbitrary JSON (and near-valid arguments around each tool's real fields, real
handles of jobs in every status included) and sends it as raw 2026-07-28 JSON-RPC over Streamable
HTTP through the scanning relay. `FUZZ_EXAMPLES` raises the number of cases per test.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel

from handles import Handles, HandlesConfig, JobContext
from tests.harness.postgres import fresh_schema
from tests.reliability.conftest import Deployment, token
from tests.reliability.support import RawReply, raw_call

pytestmark = pytest.mark.timeout(300)

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "80"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
    # Shrinking over HTTP takes minutes; the failing case is printed as drawn (FUZZ_SHRINK=1 shrinks it).
    phases=list(Phase) if os.environ.get("FUZZ_SHRINK") else [p for p in Phase if p is not Phase.shrink],
)
CLEAR_ERROR_CODES = {-32600, -32601, -32602, -32020, -32021, -32022}
TOOLS: dict[str, list[str]] = {
    # tool -> its real argument names (the fuzzer mixes them with junk)
    "echo_start": ["text", "count", "ratio", "flag", "choice", "items", "nested", "idempotency_key"],
    "quick_start": ["x", "idempotency_key"],
    "leaky_start": ["mode"],
    "echo": ["text", "count", "ratio", "flag", "choice", "items", "nested"],
    "quick": ["x"],
    **{
        f"{job}_{verb}": ["handle", "wait_seconds"]
        for job in ("echo", "approve", "charge", "noisy", "slow", "kept", "sized")
        for verb in ("progress", "fetch")
    },
    **{f"{job}_cancel": ["handle"] for job in ("echo", "approve", "charge", "slow")},
    "approve_respond": ["handle", "responses"],
    "noisy_respond": ["handle", "responses"],
}

ODD_CHARACTERS = [
    "\ud800",
    "\x00",
    "\u202e",
    "\u2066",
    "\x1b",
    "\ufeff",
    "\U000e0041",
    "\udfff",
    "\U0010ffff",
]
ODD = st.sampled_from(ODD_CHARACTERS)
TEXT = st.text(max_size=30) | st.lists(ODD | st.text(max_size=8), max_size=4).map("".join)
"""Any text, and text with NUL, control, bidi, tag and lone surrogate characters (valid JSON escapes)."""
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)


@pytest.fixture(scope="module")
def real_handles(deployment: Deployment) -> list[str]:
    """Alice's handles of jobs that are completed, failed, waiting for an answer, and cancelled."""

    async def make() -> list[str]:
        async with httpx2.AsyncClient(timeout=30) as http:

            async def start(tool: str, arguments: dict[str, Any]) -> str:
                reply = await raw_call(
                    http,
                    deployment.url,
                    "tools/call",
                    {"name": tool, "arguments": arguments},
                    token=token("alice"),
                )
                return str(reply.tool_body()["handle"])

            handles = [
                await start("echo_start", {"text": "fuzz"}),
                await start("leaky_start", {"mode": "exception"}),
                await start("approve_start", {"version": "fuzz"}),
                await start("approve_start", {"version": "fuzz-2"}),
                await start("slow_start", {"seconds": 60}),
            ]
            await raw_call(
                http,
                deployment.url,
                "tools/call",
                {"name": "slow_cancel", "arguments": {"handle": handles[-1]}},
                token=token("alice"),
            )
            await asyncio.sleep(1.0)  # the approve jobs reach input_required, the others end
            return handles

    return asyncio.run(make())


STARTS = ["echo_start", "echo", "quick_start", "quick", "leaky_start"]
TYPED: dict[str, st.SearchStrategy[Any]] = {
    # values of the right JSON type, mostly in range, so that calls get past schema validation
    "text": TEXT,
    "mode": st.sampled_from(["exception", "step"]) | TEXT,
    "count": st.integers(0, 1000) | st.integers(),
    "ratio": st.floats(0, 1) | st.floats(),
    "flag": st.booleans(),
    "choice": st.sampled_from(["a", "b", "c"]),
    "items": st.lists(st.integers(-(2**70), 2**70), max_size=5),
    "nested": st.none() | st.dictionaries(TEXT, JSON, max_size=3),
    "x": st.integers(-(2**70), 2**70),
    "idempotency_key": st.none() | TEXT | st.text(min_size=190, max_size=210),
}


def mostly(n: int) -> st.SearchStrategy[bool]:
    """True n-1 times in n. (hypothesis favours small draws, so the likely outcome is the one at 0.)"""
    return st.integers(0, n - 1).map(lambda value: value != n - 1)


def value_for(field: str, handles: list[str]) -> st.SearchStrategy[Any]:
    if field == "handle":
        typed = st.sampled_from(handles) | TEXT
    elif field == "wait_seconds":
        # A real handle only waits while its job works on its own; none of the fuzz handles does.
        typed = st.floats(min_value=-10, max_value=1e308, allow_nan=False)
    elif field == "responses":
        answer = st.fixed_dictionaries({}, optional={"approve": JSON | st.booleans(), "note": JSON | TEXT})
        typed = st.dictionaries(st.sampled_from(["q1", "q2", "x"]) | st.text(max_size=5), answer | JSON)
    else:
        typed = TYPED[field]
    return mostly(8).flatmap(lambda right_type: typed if right_type else JSON)


@st.composite
def tool_calls(draw: st.DrawFn, handles: list[str]) -> tuple[str, Any]:
    name = draw(st.sampled_from(sorted(TOOLS)) | st.sampled_from(STARTS))  # half of the calls start a job
    if not draw(mostly(10)):
        return name, draw(JSON)  # not even an object
    chosen = [field for field in TOOLS[name] if draw(mostly(4))]
    arguments = {field: draw(value_for(field, handles)) for field in chosen}
    if draw(st.booleans()):
        arguments.update(draw(st.dictionaries(st.text(max_size=8), JSON, max_size=2)))
    return name, arguments


def note(label: str) -> None:
    with contextlib.suppress(InvalidArgument):  # outside a hypothesis test there is nothing to count
        event(label)


def assert_not_a_crash(reply: RawReply, what: str) -> None:
    assert reply.status < 500, f"{what}: HTTP {reply.status} {reply.raw[:300]}"
    assert reply.body is not None, f"{what}: no JSON-RPC answer: {reply.raw[:300]}"
    if "error" in reply.body:
        note(f"JSON-RPC error {reply.body['error']['code']}")
        assert reply.body["error"]["code"] in CLEAR_ERROR_CODES, f"{what}: {reply.body['error']}"
        assert reply.body["error"]["message"], what
        return
    result = reply.body["result"]
    if not result.get("isError"):
        note(f"answer: {result.get('resultType', 'complete')}")
        return
    text_ = result["content"][0]["text"]
    assert not text_.startswith("Error executing tool") or ":" in text_, f"{what}: a crash: {text_}"
    body = reply.tool_body()
    kind = body.get("error") or (result.get("structuredContent") or {}).get("status")
    if "not valid Unicode" in str(body.get("message")):
        kind = "invalid_arguments (not valid Unicode)"
    note(f"tool error: {'schema validation' if kind == 'sdk' else kind}")


async def _send(deployment: Deployment, method: str, params: Any, declare: bool) -> RawReply:
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=60)) as http:
        return await raw_call(http, deployment.url, method, params, token=token("alice"), declare=declare)


@FUZZ
@given(data=st.data())
def test_fuzzed_tool_arguments_get_a_clear_error_or_a_valid_answer(
    deployment: Deployment, real_handles: list[str], data: st.DataObject
) -> None:
    name, arguments = data.draw(tool_calls(real_handles))
    declare = data.draw(st.booleans())
    reply = asyncio.run(_send(deployment, "tools/call", {"name": name, "arguments": arguments}, declare))
    assert_not_a_crash(reply, f"tools/call {name} {arguments!r:.200}")


@st.composite
def task_params(draw: st.DrawFn, handles: list[str]) -> tuple[str, Any]:
    method = draw(st.sampled_from(["tasks/get", "tasks/update", "tasks/cancel"]))
    if not draw(mostly(10)):
        return method, draw(JSON)
    params: dict[str, Any] = {}
    if draw(mostly(10)):
        params["taskId"] = draw(st.sampled_from(handles) | TEXT | JSON)
    if method == "tasks/update" or draw(st.booleans()):
        response = st.fixed_dictionaries(
            {},
            optional={
                "action": st.sampled_from(["accept", "decline", "cancel"]) | JSON,
                "content": st.fixed_dictionaries({}, optional={"approve": st.booleans() | JSON, "note": JSON})
                | JSON,
            },
        )
        params["inputResponses"] = draw(
            st.dictionaries(st.sampled_from(["q1", "q2"]) | st.text(max_size=4), response | JSON) | JSON
        )
    params.update(draw(st.dictionaries(st.text(max_size=8), JSON, max_size=2)))
    return method, params


@FUZZ
@given(data=st.data())
def test_fuzzed_tasks_params_get_a_clear_error_or_a_valid_answer(
    deployment: Deployment, real_handles: list[str], data: st.DataObject
) -> None:
    method, params = data.draw(task_params(real_handles))
    declare = data.draw(mostly(5))
    reply = asyncio.run(_send(deployment, method, params, declare))
    assert_not_a_crash(reply, f"{method} {params!r:.200}")
    if reply.body is not None and "result" in reply.body:
        result = reply.body["result"]
        assert result["resultType"] == "complete"
        if method == "tasks/get":
            assert result["status"] in {"working", "input_required", "completed", "failed", "cancelled"}


ODD_TEXTS = [*ODD_CHARACTERS, "ok\ud800ok", "\x00\x00", "\u202eevil\u202c"]


def odd_calls(handles: list[str]) -> list[tuple[str, str, dict[str, Any]]]:
    """Every odd text in every string field a caller controls, on both faces."""
    approve = handles[2]
    calls: list[tuple[str, str, dict[str, Any]]] = []
    for odd in ODD_TEXTS:
        calls += [
            ("tools/call", "echo_start", {"text": odd}),
            ("tools/call", "echo_start", {"text": "t", "nested": {odd: odd}}),
            ("tools/call", "echo", {"text": odd}),
            ("tools/call", "quick_start", {"x": 1, "idempotency_key": odd}),
            ("tools/call", "leaky_start", {"mode": odd}),
            ("tools/call", "echo_progress", {"handle": odd}),
            (
                "tools/call",
                "approve_respond",
                {"handle": approve, "responses": {"q1": {"approve": True, "note": odd}}},
            ),
            ("tools/call", "approve_respond", {"handle": approve, "responses": {odd: {"approve": True}}}),
            ("tasks/get", "", {"taskId": odd}),
            (
                "tasks/update",
                "",
                {
                    "taskId": approve,
                    "inputResponses": {"q1": {"action": "accept", "content": {"note": odd, "approve": True}}},
                },
            ),
        ]
    return calls


async def test_odd_characters_in_every_string_field_get_a_clear_answer(
    deployment: Deployment, real_handles: list[str]
) -> None:
    tried = 0
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=60)) as http:
        for method, tool, arguments in odd_calls(real_handles):
            params = {"name": tool, "arguments": arguments} if tool else arguments
            reply = await raw_call(http, deployment.url, method, params, token=token("alice"))
            assert_not_a_crash(reply, f"{method} {tool} {arguments!r:.200}")
            tried += 1
    assert tried == 10 * len(ODD_TEXTS)


# -- found by fuzzing: strings PostgreSQL cannot store ---------------------------------------------------


class Note(BaseModel):
    note: str


@pytest.fixture
def pg_url(postgres_url: str) -> Iterator[str]:
    with fresh_schema(postgres_url.split("?")[0], "handles_fuzz") as url:
        yield url


async def test_nul_and_lone_surrogates_are_clear_errors_on_postgresql(pg_url: str, tmp_path: Any) -> None:
    from mcp import Client

    jobs = Handles(
        HandlesConfig(database_url=pg_url, secret_keys=("f" * 40,), auto_migrate=True, data_dir=tmp_path)
    )

    @jobs.job(asks_input=True)
    async def note(ctx: JobContext, text: str) -> str:
        return (await ctx.ask("A note?", Note)).note

    server: MCPServer[Any] = MCPServer("fuzz-pg", extensions=[jobs.tasks_extension()])
    jobs.bind(server)
    try:
        async with Client(server) as client:
            for arguments in (
                {"text": "x", "idempotency_key": "a\x00b"},
                {"text": "x", "idempotency_key": "\ud800"},
                {"text": "lone \ud800 surrogate"},
            ):
                reply = await client.call_tool("note_start", arguments)
                assert reply.is_error and '"invalid_arguments"' in reply.content[0].text, reply  # type: ignore[union-attr]
            handle = (
                await client.call_tool("note_start", {"text": "ok \x00 nul is fine in JSON"})
            ).structured_content
            assert handle is not None
            for _ in range(100):
                state = await client.call_tool("note_progress", {"handle": handle["handle"]})
                if state.structured_content and state.structured_content["status"] == "input_required":
                    break
                await asyncio.sleep(0.05)
            refused = await client.call_tool(
                "note_respond", {"handle": handle["handle"], "responses": {"q1": {"note": "\udfff"}}}
            )
            assert refused.is_error and '"invalid_arguments"' in refused.content[0].text  # type: ignore[union-attr]
            taken = await client.call_tool(
                "note_respond", {"handle": handle["handle"], "responses": {"q1": {"note": "fine"}}}
            )
            assert taken.structured_content is not None and taken.structured_content["accepted"] == ["q1"]
    finally:
        await jobs.aclose()
