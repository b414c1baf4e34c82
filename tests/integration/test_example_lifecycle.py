"""The example server through the official `mcp.Client`: in-process, over stdio, over Streamable HTTP.

Every test here runs once per transport (the `example` fixture). Every reply goes
through `ToolClient.check`: one text block equal to the structured content, and
structured content valid against the tool's listed output schema, error results
included.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from jsonschema.validators import Draft202012Validator, validator_for
from mcp.server.mcpserver.utilities.func_metadata import func_metadata

from example_server.server import _revenue, lookup_account
from handles.tool_layout import LAYOUTS, ToolLayout
from tests.support import (
    Connected,
    ToolClient,
    expired_twin,
    job_id_of,
    last_char_spellings,
    tampered_handles,
)

JOBS = {"generate_report": 6, "deploy_release": 6, "export_dataset": 1}
"""The example jobs and their retention in hours."""


@pytest.fixture(params=LAYOUTS)
def layout(request: pytest.FixtureRequest) -> ToolLayout:
    """Every test here runs in both tool layouts: per job, and compact (shared jobs_* tools)."""
    layout: ToolLayout = request.param
    return layout


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


async def start(client: ToolClient, job: str, **arguments: object) -> dict[str, object]:
    reply = await client.call(f"{job}_start", arguments)
    assert not reply.is_error, reply.data
    return reply.data


# -- the listing -----------------------------------------------------------------------------


async def test_every_tool_declares_input_and_output_schemas(example: Connected) -> None:
    tools = await example.client.tools()
    expected = {example.tool(job, verb) for job in JOBS for verb in ("start", "progress", "fetch", "cancel")}
    expected |= {example.tool("deploy_release", "respond"), "lookup_account"}
    assert expected <= set(tools)
    assert "generate_report_respond" not in tools and "export_dataset_respond" not in tools, (
        "respond only for the job that asks questions"
    )
    for tool in (tools[name] for name in sorted(expected)):
        assert tool.input_schema["type"] == "object", tool.name
        assert tool.output_schema is not None and tool.output_schema["type"] == "object", tool.name
        for schema in (tool.input_schema, tool.output_schema):
            validator_for(schema, default=Draft202012Validator).check_schema(schema)
    for job, hours in JOBS.items():
        start_tool = tools[f"{job}_start"]
        assert "idempotency_key" in start_tool.input_schema["properties"]
        assert f"{hours} hour" in (start_tool.description or ""), "the retention is stated"
        assert set(tools[f"{job}_start"].output_schema["required"]) >= {  # type: ignore[index]
            "handle", "status", "poll_after_ms", "expires_at", "next"
        }  # fmt: skip
        for verb in ("progress", "fetch", "cancel"):
            assert tools[example.tool(job, verb)].input_schema["required"] == ["handle"]
        assert tools[example.tool(job, "progress")].annotations.read_only_hint is True  # type: ignore[union-attr]
        assert tools[example.tool(job, "cancel")].annotations.destructive_hint is True  # type: ignore[union-attr]
    report = tools[example.tool("generate_report", "fetch")].output_schema
    assert report is not None
    assert "result" in report["properties"], "fetch declares the job's own result shape"
    assert tools["generate_report_start"].input_schema["required"] == ["account"]


# -- full lifecycles -----------------------------------------------------------------------------


async def test_generate_report_lifecycle(example: Connected) -> None:
    client = example.client
    before = datetime.now(UTC)
    started = await start(client, "generate_report", account="acme", months=4)
    assert (
        started["status"] == "working" and started["created"] is True and started["job"] == "generate_report"
    )
    assert started["poll_after_ms"] == 2000
    expires = parse_time(str(started["expires_at"]))
    assert (
        before + timedelta(hours=6) - timedelta(seconds=5)
        <= expires
        <= datetime.now(UTC) + timedelta(hours=6)
    )
    assert example.tool("generate_report", "progress") in str(started["next"]) and example.tool(
        "generate_report", "fetch"
    ) in str(started["next"])
    handle = str(started["handle"])
    assert job_id_of(handle, example.key, example.principal)

    early = await client.call(example.tool("generate_report", "fetch"), {"handle": handle})
    assert not early.is_error and early["status"] == "working"
    assert early["result"] is None, "no result is invented before completion"
    assert early["next"].startswith("The result is not ready yet.")
    assert early["poll_after_ms"] == 2000

    done = await client.call(example.tool("generate_report", "fetch"), {"handle": handle, "wait_seconds": 20})
    assert not done.is_error and done["status"] == "completed"
    months = [_revenue("acme", m) for m in range(4)]
    assert done["result"] == {
        "account": "acme",
        "months": 4,
        "revenue_by_month": months,
        "total_revenue": round(sum(months), 2),
    }
    assert done["poll_after_ms"] is None and done["error"] is None and done["tool_error"] is None

    progress = await client.call(example.tool("generate_report", "progress"), {"handle": handle})
    assert progress["status"] == "completed" and progress["poll_after_ms"] is None
    assert progress["progress"] == {"done": 4.0, "total": 4.0, "fraction": 1.0}
    assert progress["attempts"] == 1 and progress["input_requests"] == {}
    assert example.tool("generate_report", "fetch") in progress["next"]

    cancelled = await client.call(example.tool("generate_report", "cancel"), {"handle": handle})
    assert not cancelled.is_error
    assert cancelled["status"] == "completed" and cancelled["cancel_requested"] is False
    assert "changed nothing" in cancelled["next"]
    again = await client.call(example.tool("generate_report", "fetch"), {"handle": handle})
    assert again["result"] == done["result"], "a finished job's result stays as it was"


async def test_deploy_release_asks_and_continues_with_the_answer(example: Connected) -> None:
    client = example.client
    handle = str((await start(client, "deploy_release", version="2.4.0"))["handle"])
    asked = await client.wait_status("deploy_release", handle, "input_required")
    assert list(asked["input_requests"]) == ["q1"]
    question = asked["input_requests"]["q1"]
    assert "2.4.0" in question["message"]
    schema = question["requested_schema"]
    assert schema["properties"]["environment"]["enum"] == ["staging", "production"]
    assert set(schema["required"]) == {"approve", "environment"}
    assert example.tool("deploy_release", "respond") in asked["next"] and "q1" in asked["next"]
    waiting = await client.call(example.tool("deploy_release", "fetch"), {"handle": handle})
    assert waiting["status"] == "input_required" and waiting["result"] is None

    wrong = await client.call(
        example.tool("deploy_release", "respond"),
        {"handle": handle, "responses": {"q1": {"approve": "yes", "environment": "moon"}}},
    )
    assert wrong.is_error and wrong["error"] == "invalid_arguments"
    assert "q1.approve" in wrong["message"] and "q1.environment" in wrong["message"]
    assert "nothing was stored" in wrong["next"]
    unknown = await client.call(
        example.tool("deploy_release", "respond"), {"handle": handle, "responses": {"q9": {"approve": True}}}
    )
    assert unknown.is_error and unknown["error"] == "invalid_arguments", "a reply that answers nothing"
    assert unknown["open_questions"] == ["q1"] and "q9" in unknown["message"] and "q1" in unknown["next"]

    answered = await client.call(
        example.tool("deploy_release", "respond"),
        {"handle": handle, "responses": {"q1": {"approve": True, "environment": "staging"}}},
    )
    assert not answered.is_error and answered["accepted"] == ["q1"] and answered["ignored"] == []
    assert answered["status"] == "working" and answered["input_requests"] == {}

    done = await client.call(example.tool("deploy_release", "fetch"), {"handle": handle, "wait_seconds": 20})
    assert done["status"] == "completed" and not done.is_error
    assert done["result"] == {
        "version": "2.4.0",
        "environment": "staging",
        "steps": ["build", "test", "package", "upload", "migrate", "switch traffic"],
    }
    late = await client.call(
        example.tool("deploy_release", "respond"),
        {"handle": handle, "responses": {"q1": {"approve": False, "environment": "staging"}}},
    )
    assert late["accepted"] == [] and late["ignored"] == ["q1"] and late["status"] == "completed"


async def test_refused_deployment_ends_completed_with_a_tool_error(example: Connected) -> None:
    client = example.client
    handle = str((await start(client, "deploy_release", version="9.9.9"))["handle"])
    await client.wait_status("deploy_release", handle, "input_required")
    await client.call(
        example.tool("deploy_release", "respond"),
        {"handle": handle, "responses": {"q1": {"approve": False, "environment": "production"}}},
    )
    done = await client.call(example.tool("deploy_release", "fetch"), {"handle": handle, "wait_seconds": 20})
    assert done.is_error, "a tool-level error is isError"
    assert done["status"] == "completed", "and the job still completed"
    assert done["tool_error"] == "Deployment of 9.9.9 was not approved; nothing was deployed."
    assert done["result"] is None and done["error"] is None
    progress = await client.call(example.tool("deploy_release", "progress"), {"handle": handle})
    assert not progress.is_error and progress["status"] == "completed"


async def test_export_dataset_cancelled_mid_way(example: Connected) -> None:
    client = example.client
    handle = str((await start(client, "export_dataset", rows=1000))["handle"])
    deadline = time.monotonic() + 10
    while True:  # long-poll until the first chunk is reported
        progress = await client.call(
            example.tool("export_dataset", "progress"), {"handle": handle, "wait_seconds": 5}
        )
        if progress["progress"]["done"]:
            break
        assert progress["status"] == "working" and time.monotonic() < deadline
    cancelled = await client.call(example.tool("export_dataset", "cancel"), {"handle": handle})
    assert not cancelled.is_error and cancelled["cancel_requested"] is True
    assert cancelled["status"] in ("working", "cancelled")

    final = await client.call(example.tool("export_dataset", "fetch"), {"handle": handle, "wait_seconds": 20})
    assert final["status"] == "cancelled", "the cancel landed mid-way"
    assert final["result"] is None and not final.is_error
    assert "cancelled" in final["next"] and "export_dataset_start" in final["next"]
    after = await client.call(example.tool("export_dataset", "progress"), {"handle": handle})
    assert after["status"] == "cancelled" and after["poll_after_ms"] is None
    assert 0 < after["progress"]["done"] < 1000, "it stopped before the end"
    repeat = await client.call(example.tool("export_dataset", "cancel"), {"handle": handle})
    assert not repeat.is_error and repeat["status"] == "cancelled" and "changed nothing" in repeat["next"]


# -- handles that are not valid here --------------------------------------------------------------


async def test_tampered_truncated_and_made_up_handles_are_refused_alike(example: Connected) -> None:
    client = example.client
    report = str((await start(client, "generate_report", account="acme", months=2))["handle"])
    deploy = str((await start(client, "deploy_release", version="1.0.0"))["handle"])
    reference = await client.call(
        example.tool("generate_report", "progress"), {"handle": "not-a-real-handle"}
    )
    assert reference.is_error and reference["error"] == "unknown_handle"
    assert reference.structured is None, "a caller error is text only, since it has no status to report"
    assert "generate_report_start" in reference["next"]
    for handle, job, verbs in (
        (report, "generate_report", ["progress", "fetch", "cancel"]),
        (deploy, "deploy_release", ["progress", "respond"]),
    ):
        tools = [example.tool(job, verb) for verb in verbs]
        for variant, bad in tampered_handles(handle).items():
            for tool in tools:
                arguments: dict[str, object] = {"handle": bad}
                if tool.endswith("_respond"):
                    arguments["responses"] = {"q1": {"approve": True, "environment": "staging"}}
                reply = await client.call(tool, arguments)
                assert reply.is_error, (variant, tool)
                assert reply.data["error"] == "unknown_handle", (variant, tool)
                made_up = await client.call(tool, {**arguments, "handle": "not-a-real-handle"})
                assert reply.text == made_up.text, (
                    f"{variant} on {tool} must look exactly like a made-up handle"
                )
                assert f"{job}_start" in reply["next"]
    still = await client.call(example.tool("generate_report", "progress"), {"handle": report})
    assert not still.is_error and still["status"] in ("working", "completed"), (
        "the genuine handle still works"
    )


async def test_every_other_spelling_of_the_last_character_is_refused_like_a_made_up_handle(
    example: Connected,
) -> None:
    client = example.client
    handle = str((await start(client, "generate_report", account="acme", months=2))["handle"])
    made_up = await client.call(example.tool("generate_report", "progress"), {"handle": "not-a-real-handle"})
    for respelled in last_char_spellings(handle):
        reply = await client.call(example.tool("generate_report", "progress"), {"handle": respelled})
        assert reply.is_error and reply.text == made_up.text, respelled
    assert not (await client.call(example.tool("generate_report", "progress"), {"handle": handle})).is_error


async def test_a_handle_used_with_another_jobs_tools(example: Connected) -> None:
    if example.layout == "compact":
        pytest.skip("one set of follow tools serves every job: there is no other job's tool to misuse")
    client = example.client
    report = str((await start(client, "generate_report", account="acme", months=2))["handle"])
    for tool in (
        example.tool("export_dataset", "progress"),
        example.tool("export_dataset", "fetch"),
        example.tool("export_dataset", "cancel"),
        example.tool("deploy_release", "respond"),
    ):
        arguments: dict[str, object] = {"handle": report}
        if tool.endswith("_respond"):
            arguments["responses"] = {}
        reply = await client.call(tool, arguments)
        assert reply.is_error and reply["error"] == "wrong_job", tool
        assert (
            "generate_report" in reply["message"]
            and example.tool("generate_report", "progress") in reply["next"]
        )
    done = await client.call(example.tool("generate_report", "fetch"), {"handle": report, "wait_seconds": 20})
    assert done["status"] == "completed", "the wrong tool's cancel did not touch the job"


async def test_an_expired_handle_says_so(example: Connected) -> None:
    client = example.client
    handle = str((await start(client, "export_dataset", rows=10))["handle"])
    await client.assert_expired(
        "export_dataset", expired_twin(handle, example.key, example.principal), "1 hour"
    )
    live = await client.call(example.tool("export_dataset", "progress"), {"handle": handle})
    assert not live.is_error, "the job itself is untouched; only the expired handle is refused"


# -- idempotency ----------------------------------------------------------------------------------


async def test_idempotency_key_returns_the_same_job(example: Connected) -> None:
    client = example.client
    first = await start(client, "generate_report", account="acme", months=2, idempotency_key="order-17")
    second = await start(client, "generate_report", account="acme", months=2, idempotency_key="order-17")
    assert first["created"] is True and second["created"] is False
    assert second["handle"] == first["handle"] and second["expires_at"] == first["expires_at"]
    assert "no new job was started" in str(second["next"])

    conflict = await client.call(
        "generate_report_start", {"account": "acme", "months": 3, "idempotency_key": "order-17"}
    )
    assert conflict.is_error and conflict["error"] == "idempotency_conflict"
    assert "order-17" in conflict["message"]

    other_kind = await start(client, "export_dataset", rows=5, idempotency_key="order-17")
    assert other_kind["created"] is True, "a key is scoped to its job"
    fresh = await start(client, "generate_report", account="acme", months=2)
    assert fresh["handle"] != first["handle"], "without a key every start is a new job"


async def test_invalid_arguments_are_tool_errors(example: Connected) -> None:
    client = example.client
    for tool, arguments, expected in (
        # Checked against the published input schema, before the SDK's own validation.
        ("generate_report_start", {"account": "acme", "months": 0}, "months"),
        ("generate_report_start", {"months": 2}, "account is required"),
        ("export_dataset_start", {"rows": "many"}, "rows"),
        (example.tool("generate_report", "progress"), {"handle": "x", "wait_seconds": -1}, "wait_seconds"),
        # Checked by handles while it starts the job.
        ("generate_report_start", {"account": "acme", "idempotency_key": ""}, "idempotency_key"),
        ("generate_report_start", {"account": "a" * 70_000}, "65536 bytes"),
    ):
        reply = await client.call(tool, arguments)
        assert reply.is_error and reply.structured is None, (tool, arguments)
        assert reply["error"] == "invalid_arguments"
        assert expected in reply["message"], reply["message"]
        assert reply["next"], "every error says what to do next"


async def test_every_argument_mistake_on_every_generated_tool_gets_the_handles_error_shape(
    example: Connected,
) -> None:
    """Wrong type, missing, out of range, unknown name: which argument, what was expected, what to call next."""
    client = example.client
    handle = str((await start(client, "deploy_release", version="1.0.0"))["handle"])
    tools = await client.tools()
    mistakes: list[tuple[str, dict[str, object], str]] = [
        (
            example.tool("generate_report", "progress"),
            {"handle": handle, "wait_seconds": -3},
            "wait_seconds: should be greater",
        ),
        (
            example.tool("generate_report", "fetch"),
            {"handle": handle, "wait_seconds": "soon"},
            "wait_seconds: should be a valid",
        ),
        (example.tool("generate_report", "progress"), {"handle": 123}, "handle: should be a valid string"),
        (example.tool("generate_report", "cancel"), {}, "handle is required (string) but missing"),
        (
            example.tool("deploy_release", "respond"),
            {"handle": handle, "responses": "yes"},
            "responses: should be an object",
        ),
        (
            example.tool("deploy_release", "respond"),
            {"handle": handle},
            "responses is required (object) but missing",
        ),
        ("generate_report_start", {"account": ["acme"]}, "account: should be a valid string"),
        (
            "generate_report",
            {"account": "acme", "months": 1000},
            "months: should be less than or equal to 120",
        ),
    ]
    for name in tools:
        if name.startswith(("generate_report", "deploy_release", "export_dataset", "jobs_")):
            known = {"handle": handle} if "handle" in tools[name].input_schema["properties"] else {}
            mistakes.append(
                (name, {**known, "fromat": "mp4"}, f"{name} has no argument named fromat; it accepts")
            )
    for tool, arguments, expected in mistakes:
        reply = await client.call(tool, arguments)
        assert reply.is_error and reply.structured is None, (tool, arguments, reply.text)
        assert reply["error"] == "invalid_arguments", (tool, reply.text)
        assert expected in reply["message"], (tool, reply["message"])
        assert f"{tool} again with" in reply["next"], (tool, reply["next"])
        assert "pydantic" not in reply.text and "validation error" not in reply.text, reply.text
        if "fromat" in arguments:
            accepted = list(tools[tool].input_schema["properties"])
            assert reply["accepted"] == accepted and ", ".join(accepted) in reply["message"]
    after = await client.call(example.tool("deploy_release", "progress"), {"handle": handle})
    assert not after.is_error, "the mistakes changed nothing"


def own_schema(transport: str, function: Any) -> dict[str, Any]:
    """The input schema the example's framework itself publishes for an ordinary tool `function`."""
    if transport.startswith("fastmcp"):
        from fastmcp.tools import Tool

        return Tool.from_function(function).parameters
    return func_metadata(function).arg_model.model_json_schema(by_alias=True)


async def test_generated_input_schemas_refuse_unknown_arguments(example: Connected) -> None:
    tools = await example.client.tools()
    generated = [
        name
        for name in tools
        if name.startswith(("generate_report", "deploy_release", "export_dataset", "jobs_"))
    ]
    expected = {"per_job": 16, "compact": 10}[example.layout]
    assert len(generated) == expected, (
        "per job: 4 handle tools per job, deploy_release_respond and 3 plain tools; "
        "compact: a start and a plain tool per job, and the 4 shared jobs_* tools"
    )
    for name in generated:
        assert tools[name].input_schema["additionalProperties"] is False, name
    assert tools["lookup_account"].input_schema == own_schema(example.transport, lookup_account), (
        "the server's own tools are untouched: their schema is the one their framework derives"
    )
    typo = await example.client.client.call_tool(
        "generate_report_start", {"account": "acme", "fromat": "mp4"}
    )
    assert typo.is_error, "an unknown argument name never runs the job with a default instead"


# -- long-polling ----------------------------------------------------------------------------------


async def test_long_poll_returns_promptly_on_a_change(example: Connected) -> None:
    """The servers poll the store only every 5 s: a prompt answer can only come from the change itself."""
    client = example.client
    handle = str((await start(client, "generate_report", account="acme", months=2))["handle"])
    first = await client.call(example.tool("generate_report", "progress"), {"handle": handle})
    began = time.monotonic()
    changed = await client.call(
        example.tool("generate_report", "progress"), {"handle": handle, "wait_seconds": 30}
    )
    assert time.monotonic() - began < 2, "the next progress report (0.5 s away) ends the wait"
    assert changed["updated_at"] != first["updated_at"]

    done = await client.call(example.tool("generate_report", "fetch"), {"handle": handle, "wait_seconds": 30})
    answered_at = datetime.now(UTC)
    assert done["status"] == "completed"
    finished_at = parse_time(
        (await client.call(example.tool("generate_report", "progress"), {"handle": handle}))["updated_at"]
    )
    lag = (answered_at - finished_at).total_seconds()
    assert -0.5 < lag < 1.0, f"fetch answered {lag:.2f} s after the job completed"

    began = time.monotonic()
    still = await client.call(
        example.tool("generate_report", "progress"), {"handle": handle, "wait_seconds": 30}
    )
    assert still["status"] == "completed" and time.monotonic() - began < 2, "an ended job never waits"


async def test_long_poll_answers_at_once_when_the_caller_must_act(example: Connected) -> None:
    """Waiting for a job that waits for the caller would only stall the caller."""
    client = example.client
    handle = str((await start(client, "deploy_release", version="1.2.3"))["handle"])
    await client.wait_status("deploy_release", handle, "input_required")
    for tool in (example.tool("deploy_release", "progress"), example.tool("deploy_release", "fetch")):
        began = time.monotonic()
        reply = await client.call(tool, {"handle": handle, "wait_seconds": 30})
        assert reply["status"] == "input_required" and time.monotonic() - began < 2, tool
        assert example.tool("deploy_release", "respond") in reply["next"], tool
