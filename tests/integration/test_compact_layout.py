"""The compact tool layout: `<job>_start` and `<job>` per job, one shared `jobs_progress`, `jobs_fetch`,
`jobs_cancel` and `jobs_respond` for every job, through the official client in-process and over
Streamable HTTP.

Every reply goes through `ToolClient.check` (output schema, error shape, and every tool its `next`
names is listed).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from example_server.server import build_server, create_jobs
from handles.handle import HandleCodec
from tests.support import (
    LOCAL_PRINCIPAL,
    TOOL_NAME_IN_TEXT,
    Connected,
    HttpExampleServer,
    ToolClient,
    connect,
    handles_config,
)

SHARED = ["jobs_progress", "jobs_fetch", "jobs_cancel", "jobs_respond"]
JOBS = ["generate_report", "deploy_release", "export_dataset"]


@pytest.fixture(params=["inprocess", "http"])
async def compact(
    request: pytest.FixtureRequest, tmp_path: Path, signing_key: str
) -> AsyncIterator[Connected]:
    """The example server in the compact layout, in-process and over Streamable HTTP."""
    if request.param == "inprocess":
        jobs = create_jobs(handles_config(tmp_path / "data", [signing_key]))
        try:
            async with connect(build_server(jobs, layout="compact"), forbidden=[signing_key]) as client:
                yield Connected(client, "inprocess", signing_key, LOCAL_PRINCIPAL)
        finally:
            await jobs.aclose()
    else:
        server: HttpExampleServer = request.getfixturevalue("http_compact_example")
        async with connect(server.url, forbidden=[signing_key]) as client:
            yield Connected(client, "http", signing_key, LOCAL_PRINCIPAL)


async def start(client: ToolClient, job: str, **arguments: object) -> str:
    reply = await client.call(f"{job}_start", arguments)
    assert not reply.is_error, reply.data
    return str(reply["handle"])


async def test_the_listing_has_one_start_and_plain_tool_per_job_and_one_shared_set(
    compact: Connected,
) -> None:
    tools = await compact.client.tools()
    expected = {*SHARED, "lookup_account", *JOBS, *(f"{job}_start" for job in JOBS)}
    assert set(tools) == expected
    for name in SHARED:
        assert tools[name].input_schema["additionalProperties"] is False, name
        assert tools[name].output_schema is not None, name
    respond = tools["jobs_respond"]
    assert "requested_schema" in (respond.description or "") and "jobs_progress" in (
        respond.description or ""
    )
    assert "jobs_progress" in (tools["generate_report_start"].description or "")
    assert "generate_report_progress" not in (tools["generate_report"].description or "")


async def test_two_jobs_followed_through_the_shared_tools(compact: Connected) -> None:
    client = compact.client
    report = await start(client, "generate_report", account="acme", months=2)
    deploy = await start(client, "deploy_release", version="3.1.0")

    asked = await client.wait_status("deploy_release", deploy, "input_required")
    assert asked["job"] == "deploy_release" and list(asked["input_requests"]) == ["q1"]
    assert "jobs_respond" in asked["next"]
    answered = await client.call(
        "jobs_respond", {"handle": deploy, "responses": {"q1": {"approve": True, "environment": "staging"}}}
    )
    assert answered["accepted"] == ["q1"] and answered["job"] == "deploy_release"

    done = await client.call("jobs_fetch", {"handle": report, "wait_seconds": 20})
    assert done["job"] == "generate_report" and done["status"] == "completed"
    assert done["result"]["account"] == "acme" and len(done["result"]["revenue_by_month"]) == 2
    deployed = await client.call("jobs_fetch", {"handle": deploy, "wait_seconds": 20})
    assert deployed["job"] == "deploy_release" and deployed["result"]["environment"] == "staging"

    progress = await client.call("jobs_progress", {"handle": report})
    assert progress["status"] == "completed" and "jobs_fetch" in progress["next"]
    nothing_asked = await client.call("jobs_respond", {"handle": report, "responses": {"q1": {"ok": True}}})
    assert nothing_asked.is_error and nothing_asked["error"] == "invalid_arguments", "a job that asks nothing"
    assert nothing_asked["open_questions"] == [] and "jobs_progress" in nothing_asked["next"]
    cancel = await client.call("jobs_cancel", {"handle": deploy})
    assert cancel["status"] == "completed" and "changed nothing" in cancel["next"]

    export = await start(client, "export_dataset", rows=1000)
    stopped = await client.call("jobs_cancel", {"handle": export})
    assert stopped["job"] == "export_dataset" and stopped["cancel_requested"] is True
    final = await client.call("jobs_fetch", {"handle": export, "wait_seconds": 20})
    assert final["status"] == "cancelled" and "export_dataset_start" in final["next"]


async def test_another_principals_handle_through_jobs_fetch_looks_made_up(compact: Connected) -> None:
    client = compact.client
    handle = await start(client, "generate_report", account="acme", months=1)
    codec = HandleCodec([compact.key])
    claims = codec.verify(handle, principal=compact.principal)
    assert claims is not None
    theirs = codec.mint(
        job_id=claims.job_id, kind=claims.kind, principal="token:someone-else", expires_at=claims.expires_at
    )
    for tool in ("jobs_fetch", "jobs_progress", "jobs_cancel"):
        refused = await client.call(tool, {"handle": theirs})
        made_up = await client.call(tool, {"handle": "not-a-real-handle"})
        assert refused.is_error and refused["error"] == "unknown_handle", tool
        assert refused.text == made_up.text, f"{tool}: another principal's handle must look made up"
        assert "generate_report_start" in refused["next"]
    still = await client.call("jobs_progress", {"handle": handle})
    assert not still.is_error, "the owner's handle is untouched"


async def test_an_answer_of_the_wrong_shape_is_refused_naming_what_was_expected(compact: Connected) -> None:
    client = compact.client
    deploy = await start(client, "deploy_release", version="4.0.0")
    await client.wait_status("deploy_release", deploy, "input_required")
    wrong = await client.call("jobs_respond", {"handle": deploy, "responses": {"q1": {"approve": "yes"}}})
    assert wrong.is_error and wrong.structured is None and wrong["error"] == "invalid_arguments"
    assert "q1.approve: expected true or false" in wrong["message"]
    assert "q1.environment: required" in wrong["message"]
    assert (
        "q1 expects approve (true or false, required), environment (one of 'staging', 'production', required)"
        in (wrong["message"])
    ), "the refusal says what the question expects, not only what was wrong"
    assert "jobs_respond" in wrong["next"] and "nothing was stored" in wrong["next"]
    waiting = await client.call("jobs_progress", {"handle": deploy})
    assert waiting["status"] == "input_required", "nothing was stored"
    not_an_object = await client.call("jobs_respond", {"handle": deploy, "responses": {"q1": "yes"}})
    assert not_an_object["error"] == "invalid_arguments" and "jobs_respond again" in not_an_object["next"]


async def test_the_argument_gate_covers_the_shared_tools(compact: Connected) -> None:
    client = compact.client
    handle = await start(client, "generate_report", account="acme", months=1)
    for tool, arguments, expected in (
        ("jobs_progress", {"handle": handle, "fromat": "mp4"}, "jobs_progress has no argument named fromat"),
        ("jobs_fetch", {"handle": handle, "wait_seconds": -1}, "wait_seconds: should be greater"),
        ("jobs_cancel", {}, "handle is required (string) but missing"),
        ("jobs_respond", {"handle": handle, "responses": "yes"}, "responses: should be an object"),
    ):
        reply = await client.call(tool, arguments)
        assert reply.is_error and reply["error"] == "invalid_arguments", (tool, reply.text)
        assert expected in reply["message"], (tool, reply["message"])
        assert f"{tool} again with" in reply["next"]


async def test_the_plain_tool_hands_off_to_the_shared_tools(compact: Connected) -> None:
    """A plain `deploy_release` call that stops at the question answers its handle and says to use jobs_respond."""
    tools = await compact.client.tools()
    result = await compact.client.client.call_tool("deploy_release", {"version": "6.0.0"})
    handoff = result.structured_content
    assert handoff is not None and handoff["status"] == "input_required", result
    assert "jobs_respond" in handoff["next"] and "jobs_progress" in handoff["next"]
    assert set(TOOL_NAME_IN_TEXT.findall(handoff["next"])) <= set(tools), handoff["next"]
    cancelled = await compact.client.call("jobs_cancel", {"handle": handoff["handle"]})
    assert cancelled["job"] == "deploy_release"
    # A job still parking (its question stored, its run unwinding) is cancelled as the park lands: the
    # reply then says the cancel is requested, and the job ends cancelled at once after.
    assert cancelled["status"] == "cancelled" or cancelled["cancel_requested"] is True, cancelled
    final = await compact.client.call("jobs_fetch", {"handle": handoff["handle"], "wait_seconds": 10})
    assert final["status"] == "cancelled", final
