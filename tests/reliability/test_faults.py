"""Gate: a dropped transport, a killed server or a lost database never repeats a call, never takes an
illegal status edge, never loses a completed result, and never runs a recorded step twice.

Real processes, real transports: the reliability server runs as a subprocess; the official client
talks to it over Streamable HTTP through a relay that cuts chosen requests (`refuse`: the server never
sees it; `cut_at_first_byte`: the connection dies as the server starts answering; `cut_after_reply`:
the server finishes and its answer is swallowed). After a cut the client reconnects (a fresh
connection and client) and resumes by handle or taskId. Database triggers log every status change,
so an illegal edge is caught even when no client saw it.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest

from handles.client.tasks import CreateTaskResult, TasksClientExtension, follow_task
from tests.harness.postgres import fresh_schema
from tests.harness.relay import Relay, WireScanner
from tests.reliability.conftest import (
    PG_PASSWORD,
    Deployment,
    codec,
    deploy,
    principal,
    token,
)
from tests.reliability.support import (
    invalid_edges,
    jobs_in_store,
    raw_call,
)

pytestmark = pytest.mark.timeout(120)

TERMINAL = {"completed", "failed", "cancelled"}


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory, scanner: WireScanner) -> Iterator[Deployment]:
    with deploy(tmp_path_factory.mktemp("faults"), scanner) as deployed:
        yield deployed


@pytest.fixture(autouse=True)
def _gates_hold(faults: Deployment) -> Iterator[None]:
    """After every scenario: no illegal edge was ever stored, and no effect ever happened twice."""
    faults.relay.clear_faults()
    yield
    faults.relay.clear_faults()
    assert invalid_edges(faults.database_url) == []
    lines = faults.effects.read_text().splitlines() if faults.effects.exists() else []
    assert len(lines) == len(set(lines)), f"an effect happened twice: {lines}"


def job_id(handle: str, name: str = "alice") -> str:
    claims = codec().verify(handle, principal=principal(name))
    assert claims is not None
    return claims.job_id


def jobs_with_marker(database_url: str, kind: str, marker: int) -> list[dict[str, Any]]:
    return [job for job in jobs_in_store(database_url, kind) if job["arguments"].get("n") == marker]


async def raw_attempt(dep: Deployment, method: str, params: dict[str, Any], name: str = "alice") -> Any:
    """One raw JSON-RPC request on a fresh connection; None when the connection dropped."""
    try:
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=60)) as http:
            return await raw_call(http, dep.url, method, params, token=token(name))
    except httpx2.TransportError:
        return None


async def until(
    dep: Deployment, job: str, handle: str, statuses: set[str], timeout: float = 20
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    async with dep.client() as client:
        while True:
            reply = await client.call(f"{job}_progress", {"handle": handle, "wait_seconds": 2})
            assert not reply.is_error, reply.data
            if reply["status"] in statuses:
                return reply.data
            assert time.monotonic() < deadline, f"{job} stayed {reply['status']}"


# -- the start call ---------------------------------------------------------------------------------


@pytest.mark.parametrize("cut", ["refuse", "cut_at_first_byte", "cut_after_reply"])
async def test_a_start_cut_anywhere_is_resumed_by_its_idempotency_key_without_a_second_job(
    faults: Deployment, cut: str
) -> None:
    key = f"drop-{cut}-{secrets.token_hex(4)}"
    marker = secrets.randbelow(10**9)
    arguments = {"n": marker, "idempotency_key": key}
    sent_before = faults.relay.count("mcp-name: charge_start")
    faults.relay.fault("mcp-name: charge_start", cut)  # type: ignore[arg-type]

    assert await faults.attempt("charge_start", arguments) is None, "the cut must reach the client"
    assert faults.relay.count("mcp-name: charge_start") == sent_before + 1, (
        "the client repeated the call by itself"
    )
    assert len(jobs_with_marker(faults.database_url, "charge", marker)) == (0 if cut == "refuse" else 1)

    # Reconnect and send the same start again, as the client is told to: one job, whatever happened.
    again = await faults.ok("charge_start", arguments)
    assert again["created"] is (cut == "refuse")
    stored = jobs_with_marker(faults.database_url, "charge", marker)
    assert [job["id"] for job in stored] == [job_id(again["handle"])], f"{len(stored)} jobs for one start"
    assert stored[0]["idempotency_key"] == key
    done = await faults.ok("charge_fetch", {"handle": again["handle"], "wait_seconds": 10})
    assert done["status"] == "completed" and done["result"]["attempt"] == 1
    assert len(faults.effects_of(job_id(again["handle"]))) == 1


@pytest.mark.parametrize("cut", ["refuse", "cut_at_first_byte", "cut_after_reply"])
async def test_a_task_creating_call_is_never_repeated_and_a_cut_one_leaves_at_most_one_job(
    faults: Deployment, cut: str
) -> None:
    marker = secrets.randbelow(10**9)
    sent_before = faults.relay.count("mcp-name: charge\r")
    faults.relay.fault("mcp-name: charge\r", cut)  # type: ignore[arg-type]
    lost = await raw_attempt(faults, "tools/call", {"name": "charge", "arguments": {"n": marker}})
    assert lost is None
    assert faults.relay.count("mcp-name: charge\r") == sent_before + 1
    stored = jobs_with_marker(faults.database_url, "charge", marker)
    # Without the answer the client cannot know the taskId; the one job (if the server got that far)
    # runs once. A client that must not start twice uses charge_start with an idempotency_key and
    # follows the handle as a taskId (next test).
    assert len(stored) == (0 if cut == "refuse" else 1)
    for job in stored:
        assert len(faults.effects_of(job["id"])) <= 1


async def test_a_tasks_client_resumes_an_idempotent_start_by_taskid_after_cuts(faults: Deployment) -> None:
    key = f"tasks-{secrets.token_hex(4)}"
    marker = secrets.randbelow(10**9)
    arguments = {"n": marker, "idempotency_key": key, "hold": 0.5}
    faults.relay.fault("mcp-name: charge_start", "cut_after_reply")
    assert await faults.attempt("charge_start", arguments) is None
    handle = (await faults.ok("charge_start", arguments))["handle"]
    faults.relay.fault("mcp-method: tasks/get", "cut_after_reply")
    assert await raw_attempt(faults, "tasks/get", {"taskId": handle}) is None
    async with faults.client(extensions=[TasksClientExtension()]) as client:
        result = await follow_task(client.client.session, handle, default_poll_seconds=0.1)
    assert result.structured_content is not None and result.structured_content["attempt"] == 1
    assert [job["id"] for job in jobs_with_marker(faults.database_url, "charge", marker)] == [job_id(handle)]
    assert len(faults.effects_of(job_id(handle))) == 1


async def test_a_task_followed_by_the_sdk_client_is_resumed_after_the_poll_is_cut(faults: Deployment) -> None:
    marker = secrets.randbelow(10**9)
    async with faults.client(extensions=[TasksClientExtension()]) as client:
        created = await client.client.session.call_tool(
            "charge", {"n": marker, "hold": 1.0}, allow_claimed=True
        )
    assert isinstance(created, CreateTaskResult)
    faults.relay.fault("mcp-method: tasks/get", "cut_at_first_byte")
    with pytest.raises((Exception, BaseExceptionGroup)):
        async with faults.client(extensions=[TasksClientExtension()]) as client:
            await follow_task(client.client.session, created, default_poll_seconds=0.1)
    # A new connection picks the known task up again; nothing was started a second time.
    async with faults.client(extensions=[TasksClientExtension()]) as client:
        result = await follow_task(client.client.session, created.task_id, default_poll_seconds=0.1)
    assert result.structured_content is not None and result.structured_content["n"] == marker
    assert [job["id"] for job in jobs_with_marker(faults.database_url, "charge", marker)] == [
        job_id(created.task_id)
    ]
    assert len(faults.effects_of(job_id(created.task_id))) == 1


@pytest.mark.parametrize("face", ["tasks", "tasks-pushed", "handles"])
async def test_the_handles_client_rides_out_cuts_of_its_start_its_polls_and_its_answer(
    faults: Deployment, tmp_path: Path, face: str
) -> None:
    """`handles.client.follow`, given a factory of connections, over the cutting relay: one job, one effect.

    On the Tasks face it either polls (`tasks/get` is cut) or takes pushed states (the
    `subscriptions/listen` stream is cut, and it falls back to polling)."""
    from handles.client import follow

    version = f"follow-{face}-{secrets.token_hex(3)}"
    prefer = "handles" if face == "handles" else "tasks"
    tasks = prefer == "tasks"
    observe = {
        "tasks": "mcp-method: tasks/get",
        "tasks-pushed": "mcp-method: subscriptions/listen",
        "handles": "mcp-name: approve_progress",
    }[face]

    @asynccontextmanager
    async def connect() -> AsyncIterator[Any]:
        extension = TasksClientExtension(push=face == "tasks-pushed")
        async with faults.client(extensions=[extension]) as tool_client:
            yield tool_client.client

    cuts = [
        faults.relay.fault("mcp-name: approve_start", "cut_after_reply"),
        faults.relay.fault(observe, "cut_at_first_byte"),
        faults.relay.fault(
            "mcp-method: tasks/update" if tasks else "mcp-name: approve_respond", "cut_after_reply"
        ),
    ]
    result = await follow(
        connect,
        "approve",
        {"version": version},
        key=version,
        journal=tmp_path / "journal.db",
        prefer=prefer,  # type: ignore[arg-type]
        on_input=lambda key, message, schema: {"approve": True, "note": "via follow"},
        long_poll_seconds=1,
        request_timeout=5,
        retries=5,
    )
    assert result == {"version": version, "approved": True, "note": "via follow"}
    assert [cut.fired for cut in cuts] == [1, 1, 1], "every cut happened"
    jobs = [
        job for job in jobs_in_store(faults.database_url, "approve") if job["arguments"]["version"] == version
    ]
    assert len(jobs) == 1, f"{len(jobs)} jobs for one follow"
    assert faults.effects_of(jobs[0]["id"]) == [f"{jobs[0]['id']} ship {version} via follow"]


# -- between completion and fetch -------------------------------------------------------------------


async def test_a_completed_result_survives_cut_fetches_on_both_faces(faults: Deployment) -> None:
    started = await faults.ok("charge_start", {"n": 3})
    handle = started["handle"]
    first = await faults.ok("charge_fetch", {"handle": handle, "wait_seconds": 10})
    assert first["status"] == "completed"
    for cut in ("cut_after_reply", "cut_at_first_byte"):
        faults.relay.fault("mcp-name: charge_fetch", cut)  # type: ignore[arg-type]
        assert await faults.attempt("charge_fetch", {"handle": handle}) is None
        again = await faults.ok("charge_fetch", {"handle": handle})
        assert again["result"] == first["result"], "the result changed or vanished after a cut"
    faults.relay.fault("mcp-method: tasks/get", "cut_after_reply")
    assert await raw_attempt(faults, "tasks/get", {"taskId": handle}) is None
    task = (await raw_attempt(faults, "tasks/get", {"taskId": handle})).result
    assert task["status"] == "completed" and task["result"]["structuredContent"] == first["result"]
    progress = await faults.ok("charge_progress", {"handle": handle})
    assert progress["attempts"] == 1, "the job ran again"
    assert len(faults.effects_of(job_id(handle))) == 1


# -- during input_required ----------------------------------------------------------------------------


async def test_cuts_while_a_question_waits_neither_lose_nor_repeat_the_answer(faults: Deployment) -> None:
    handle = (await faults.ok("approve_start", {"version": "1.0"}))["handle"]
    asked = await until(faults, "approve", handle, {"input_required"})
    assert list(asked["input_requests"]) == ["q1"]
    faults.relay.fault("mcp-name: approve_progress", "cut_at_first_byte")
    assert await faults.attempt("approve_progress", {"handle": handle}) is None
    still = await faults.ok("approve_progress", {"handle": handle})
    assert still["status"] == "input_required" and list(still["input_requests"]) == ["q1"]

    sent = faults.relay.count("mcp-name: approve_respond")
    faults.relay.fault("mcp-name: approve_respond", "cut_after_reply")
    first = {"q1": {"approve": True, "note": "first"}}
    assert await faults.attempt("approve_respond", {"handle": handle, "responses": first}) is None
    assert faults.relay.count("mcp-name: approve_respond") == sent + 1, (
        "the client repeated the answer by itself"
    )
    # The answer was taken before the cut; sending (another) answer again changes nothing.
    second = {"q1": {"approve": True, "note": "second"}}
    resent = await faults.ok("approve_respond", {"handle": handle, "responses": second})
    assert resent["accepted"] == [] and resent["ignored"] == ["q1"]
    done = await faults.ok("approve_fetch", {"handle": handle, "wait_seconds": 10})
    assert done["result"] == {"version": "1.0", "approved": True, "note": "first"}
    assert faults.effects_of(job_id(handle)) == [f"{job_id(handle)} ship 1.0 first"]


async def test_a_cut_tasks_update_is_safe_to_send_again(faults: Deployment) -> None:
    created = (
        await raw_attempt(faults, "tools/call", {"name": "approve", "arguments": {"version": "2.0"}})
    ).result
    task_id = created["taskId"]
    for _ in range(100):
        task = (await raw_attempt(faults, "tasks/get", {"taskId": task_id})).result
        if task["status"] == "input_required":
            break
        await asyncio.sleep(0.05)
    assert set(task["inputRequests"]) == {"q1"}
    first = {"q1": {"action": "accept", "content": {"approve": True, "note": "kept"}}}
    faults.relay.fault("mcp-method: tasks/update", "cut_after_reply")
    assert await raw_attempt(faults, "tasks/update", {"taskId": task_id, "inputResponses": first}) is None
    second = {"q1": {"action": "accept", "content": {"approve": False, "note": "ignored"}}}
    ack = await raw_attempt(faults, "tasks/update", {"taskId": task_id, "inputResponses": second})
    assert ack.status == 200 and ack.result["resultType"] == "complete"
    for _ in range(200):
        task = (await raw_attempt(faults, "tasks/get", {"taskId": task_id})).result
        if task["status"] in TERMINAL:
            break
        await asyncio.sleep(0.05)
    assert task["status"] == "completed"
    assert task["result"]["structuredContent"] == {"version": "2.0", "approved": True, "note": "kept"}
    assert faults.effects_of(job_id(task_id)) == [f"{job_id(task_id)} ship 2.0 kept"]


# -- right after a cancel ---------------------------------------------------------------------------------


async def test_a_cut_cancel_is_safe_to_send_again_on_both_faces(faults: Deployment) -> None:
    handle = (await faults.ok("slow_start", {"seconds": 5}))["handle"]
    await until(faults, "slow", handle, {"working"})
    sent = faults.relay.count("mcp-name: slow_cancel")
    faults.relay.fault("mcp-name: slow_cancel", "cut_after_reply")
    assert await faults.attempt("slow_cancel", {"handle": handle}) is None
    assert faults.relay.count("mcp-name: slow_cancel") == sent + 1
    seen = await faults.ok("slow_progress", {"handle": handle})
    assert seen["status"] in {
        "working",
        "cancelled",
    }  # the cancel was recorded; the job stops at a checkpoint
    again = await faults.ok("slow_cancel", {"handle": handle})
    assert again["cancel_requested"] is True
    final = await until(faults, "slow", handle, TERMINAL)
    assert final["status"] == "cancelled"

    created = (await raw_attempt(faults, "tools/call", {"name": "slow", "arguments": {"seconds": 5}})).result
    faults.relay.fault("mcp-method: tasks/cancel", "cut_after_reply")
    assert await raw_attempt(faults, "tasks/cancel", {"taskId": created["taskId"]}) is None
    ack = await raw_attempt(faults, "tasks/cancel", {"taskId": created["taskId"]})
    assert ack.status == 200 and ack.result["resultType"] == "complete"
    for _ in range(100):
        task = (await raw_attempt(faults, "tasks/get", {"taskId": created["taskId"]})).result
        if task["status"] in TERMINAL:
            break
        await asyncio.sleep(0.05)
    assert task["status"] == "cancelled"
    cancelled = await faults.call("slow_fetch", {"handle": created["taskId"]})
    assert cancelled["status"] == "cancelled" and cancelled["result"] is None


# -- the server killed during a durable step ------------------------------------------------------------


async def test_kill_9_inside_and_after_a_durable_step_never_runs_the_step_twice(faults: Deployment) -> None:
    inside = (await faults.ok("charge_start", {"n": 10, "step_hold": 5}))["handle"]
    rechecked = (await faults.ok("charge_start", {"n": 11, "step_hold": 5, "recheck": True}))["handle"]
    after = (await faults.ok("charge_start", {"n": 12, "hold": 3}))["handle"]

    def step_status(state: dict[str, Any]) -> str | None:
        return next((step["status"] for step in state["steps"] if step["name"] == "charge"), None)

    for handle, wanted in ((inside, "started"), (rechecked, "started"), (after, "completed")):
        deadline = time.monotonic() + 10
        while (
            step_status(await faults.ok("charge_progress", {"handle": handle})) != wanted
            or len(faults.effects_of(job_id(handle))) != 1  # the effect happened before the kill
        ):
            assert time.monotonic() < deadline, f"the step never became {wanted}"
            await asyncio.sleep(0.05)
    after_was_running = (await faults.ok("charge_progress", {"handle": after}))["status"] == "working"

    faults.server.kill()
    faults.server.start()

    unknown = await faults.call("charge_fetch", {"handle": inside, "wait_seconds": 10})
    assert unknown["status"] == "failed", unknown.data
    assert unknown["error"]["data"] == {"reason": "step_unknown", "step": "charge"}
    resolved = await faults.ok("charge_fetch", {"handle": rechecked, "wait_seconds": 10})
    assert resolved["status"] == "completed" and resolved["result"]["receipt"] == "recheck:1"
    replayed = await faults.ok("charge_fetch", {"handle": after, "wait_seconds": 10})
    assert replayed["status"] == "completed"
    assert replayed["result"]["receipt"] == f"{job_id(after)} charge 12", "the recorded result is replayed"
    assert replayed["result"]["attempt"] == (2 if after_was_running else 1)
    for handle in (inside, rechecked, after):
        assert len(faults.effects_of(job_id(handle))) == 1, "a recorded step ran twice"
        progress = await faults.ok("charge_progress", {"handle": handle})
        assert progress["attempts"] == (1 if handle == after and not after_was_running else 2)


# -- the database unavailable mid-job (PostgreSQL) ---------------------------------------------------------


@pytest.fixture
def pg_schema(postgres_url: str) -> Iterator[str]:
    """A schema of its own, and a URL that carries a password (trust authentication ignores it)."""
    with fresh_schema(postgres_url.split("?")[0], "handles_reliability") as url:
        user, _, rest = url.partition("@")
        yield f"{user}:{PG_PASSWORD}@{rest}"


async def test_database_outage_mid_job_heals_without_a_lost_result_or_a_repeated_step(
    pg_schema: str, tmp_path: Path, scanner: WireScanner
) -> None:
    pg_relay = Relay(5432, http=False).up()
    dep = deploy(
        tmp_path,
        scanner,
        database_url=pg_schema,
        HANDLES_DATABASE_URL=pg_relay.database_url(pg_schema),
        HANDLES_AUTO_MIGRATE="0",
        HANDLES_LEASE_SECONDS="1.5",
    )
    try:
        finishing = (await dep.ok("slow_start", {"seconds": 2.5}))["handle"]
        stepping = (await dep.ok("charge_start", {"n": 20, "pre_hold": 1.5}))["handle"]
        for job, handle in (("slow", finishing), ("charge", stepping)):  # both running before the cut
            while (await dep.ok(f"{job}_progress", {"handle": handle}))["attempts"] < 1:
                await asyncio.sleep(0.05)
        pg_relay.down()  # the database is gone: both jobs reach their next write during the outage
        outage = time.monotonic()
        refused = await dep.call("slow_progress", {"handle": finishing})
        assert refused.is_error and refused["error"] == "store_unavailable" and refused["retryable"] is True
        task = await raw_attempt(dep, "tasks/get", {"taskId": finishing})
        assert task is not None and task.status < 500 and task.error["code"] == -32603
        started = await dep.call("charge_start", {"n": 21})
        assert started.is_error and started["error"] == "store_unavailable" and "handle" not in started.data
        await asyncio.sleep(max(0.0, 3.0 - (time.monotonic() - outage)))
        pg_relay.up()

        done = await dep.ok("slow_fetch", {"handle": finishing, "wait_seconds": 15})
        assert done["status"] == "completed" and done["result"] == {"steps": 10}, done
        charged = await dep.ok("charge_fetch", {"handle": stepping, "wait_seconds": 15})
        assert charged["status"] == "completed", charged
        assert charged["result"]["attempt"] == 1, "the run's step writes wait the outage out: no retry"
        assert len(dep.effects_of(job_id(stepping))) == 1
        assert [job for job in jobs_in_store(pg_schema, "charge") if job["arguments"]["n"] == 21] == []
        # A start after the outage is served (on PostgreSQL a start's connections are the event loop's own,
        # and the outage broke every one of them).
        after = (await dep.ok("slow_start", {"seconds": 0.1}))["handle"]
        assert (await dep.ok("slow_fetch", {"handle": after, "wait_seconds": 15}))["status"] == "completed"
        assert invalid_edges(pg_schema) == []
    finally:
        dep.close()
        pg_relay.close()
