"""The capability manifest (`handles.client.read_manifest`) and the requirements a workflow checks
against it before its first call: over Streamable HTTP with the official `mcp` client, and in-process."""

from __future__ import annotations

import json
import logging
from importlib.metadata import version
from typing import Any

import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp_types import Tool
from pydantic import ValidationError

from handles.client import (
    Manifest,
    Need,
    Requirements,
    RequirementsNotMet,
    UnsupportedServerError,
    connect,
    follow,
    read_manifest,
)
from handles.client.tasks import TasksClientExtension
from handles.tool_layout import JOB_META_KEY
from tests.client.conftest import Counted
from tests.support import HttpExampleServer, InProcessExample

pytestmark = pytest.mark.timeout(60)

EXAMPLE_JOBS = {"deploy_release", "export_dataset", "generate_report"}
APPROVE = {"approve": True, "environment": "staging"}


# -- what a manifest says ------------------------------------------------------------------------------


async def test_the_manifest_of_the_example_server_over_streamable_http(
    http_example: HttpExampleServer,
) -> None:
    manifest = await read_manifest(connect(http_example.url))
    assert manifest.server == http_example.url
    assert manifest.server_name == "handles-example"
    assert manifest.server_version == version("mcp-handles")
    assert manifest.protocol_version == "2026-07-28"
    assert manifest.negotiated_by == "discover"
    assert "2026-07-28" in manifest.supported_versions
    assert manifest.tasks_offered and manifest.tasks_declared and manifest.tasks_usable
    assert manifest.task_operations == ("tasks/get", "tasks/update", "tasks/cancel")
    assert set(manifest.jobs) == EXAMPLE_JOBS, "lookup_account is a tool, not a job"
    assert "lookup_account" in manifest.tools and "deploy_release_respond" in manifest.tools
    deploy = manifest.jobs["deploy_release"]
    assert dict(deploy.tools) == {
        "plain": "deploy_release",
        "start": "deploy_release_start",
        "progress": "deploy_release_progress",
        "fetch": "deploy_release_fetch",
        "cancel": "deploy_release_cancel",
        "respond": "deploy_release_respond",
    }
    assert (deploy.layout, deploy.asks_input, deploy.plain_call) == ("per_job", True, "adaptive")
    assert deploy.modes == ("tasks", "handles", "inline")
    report = manifest.jobs["generate_report"]
    assert "respond" not in report.tools and not report.asks_input


async def test_the_compact_layout_names_the_shared_tools_and_which_job_answers(
    http_compact_example: HttpExampleServer,
) -> None:
    manifest = await read_manifest(connect(http_compact_example.url))
    assert set(manifest.jobs) == EXAMPLE_JOBS
    deploy, export = manifest.jobs["deploy_release"], manifest.jobs["export_dataset"]
    assert dict(deploy.tools) == {
        "plain": "deploy_release",
        "start": "deploy_release_start",
        "progress": "jobs_progress",
        "fetch": "jobs_fetch",
        "cancel": "jobs_cancel",
        "respond": "jobs_respond",
    }
    assert deploy.layout == export.layout == "compact"
    # jobs_respond is listed, but only the job that asks is answered through it (the server says so).
    assert "respond" not in export.tools and not export.asks_input
    assert all(job.modes == ("tasks", "handles", "inline") for job in manifest.jobs.values())


async def test_the_official_client_as_it_comes_sees_tasks_offered_but_not_usable(
    http_example: HttpExampleServer,
) -> None:
    async with Client(http_example.url) as client:  # declares no extension
        manifest = await read_manifest(client)
    assert manifest.tasks_offered and not manifest.tasks_declared and not manifest.tasks_usable
    assert manifest.tasks_designs == ("2026-07-28",)
    assert manifest.task_operations == ()
    assert all(job.modes == ("handles", "inline") for job in manifest.jobs.values())


async def test_a_handshake_era_connection_has_no_tasks(inprocess_example: InProcessExample) -> None:
    async with Client(inprocess_example.server, mode="legacy", extensions=[TasksClientExtension()]) as client:
        manifest = await read_manifest(client)
    assert manifest.negotiated_by == "initialize" and manifest.protocol_version == "2025-11-25"
    assert manifest.supported_versions == ()
    assert manifest.server_name == "handles-example"
    assert manifest.tasks_declared and not manifest.tasks_offered and not manifest.tasks_usable
    assert manifest.tasks_designs == ("2025-11-25",)  # the older design, which the client cannot follow
    with pytest.raises(RequirementsNotMet, match="initialize handshake"):
        manifest.check(Requirements(modes="tasks", jobs=["generate_report"]))


async def test_the_manifest_is_an_immutable_value_that_round_trips_through_json(
    inprocess_example: InProcessExample,
) -> None:
    manifest = await read_manifest(connect(inprocess_example.server))
    assert manifest.server == "inprocess:handles-example"
    text = manifest.model_dump_json()
    logged = json.loads(text)
    assert logged["jobs"]["deploy_release"]["modes"] == ["tasks", "handles", "inline"]
    assert logged["tasks_usable"] is True and logged["protocol_version"] == "2026-07-28"
    assert Manifest.model_validate_json(text) == manifest
    with pytest.raises(ValidationError):
        manifest.protocol_version = "2025-11-25"  # type: ignore[misc]
    with pytest.raises(TypeError):
        manifest.jobs["other"] = manifest.jobs["deploy_release"]  # type: ignore[index]
    with pytest.raises(TypeError):
        manifest.jobs["deploy_release"].tools["start"] = "elsewhere"  # type: ignore[index]


async def test_a_tasks_only_job_has_no_inline_mode(counted: Counted) -> None:
    async with counted.client(tasks=False) as client:
        manifest = await read_manifest(client)
    only = manifest.jobs["only_task"]
    assert only.plain_call == "tasks_only" and only.modes == ("handles",)
    with pytest.raises(RequirementsNotMet) as refused:
        manifest.check(Requirements(modes="inline", jobs=["only_task"]))
    assert "runs only as a task" in refused.value.message
    assert "It could run handles here" in refused.value.message
    async with counted.client() as client:
        plan = (await read_manifest(client)).check(
            Requirements(modes=("inline", "tasks"), jobs=["only_task"])
        )
    assert plan["only_task"] == "tasks"
    assert "runs only as a task" in plan.fallbacks["only_task"]
    assert not counted.calls, "reading and checking call nothing"


async def test_without_the_handles_description_jobs_are_read_from_the_tool_names(
    inprocess_example: InProcessExample,
) -> None:
    """Another server (or an older `handles`) lists no `_meta`: the names alone tell the jobs."""
    async with Client(inprocess_example.server) as client:
        tools = [tool.model_copy(update={"meta": None}) for tool in (await client.list_tools()).tools]
        extra = [
            Tool(name=name, input_schema={"type": "object"}) for name in ("engine_start", "jobs_respond")
        ]
        manifest = Manifest.of(client, [*tools, *extra])
    assert set(manifest.jobs) == EXAMPLE_JOBS, "engine_start has no progress tool and no plain tool"
    report = manifest.jobs["generate_report"]
    assert report.plain_call is None and report.layout == "per_job"
    assert report.modes == ("handles", "inline"), "the plain tool does not say it refuses"
    assert manifest.jobs["deploy_release"].asks_input and "respond" in manifest.jobs["deploy_release"].tools
    assert not report.asks_input, "in the per-job layout <job>_respond says which job asks"
    # A tool that is no job can still be called inline (or answer a task: the server decides).
    lookup = manifest.job("lookup_account")
    assert lookup is not None and dict(lookup.tools) == {"plain": "lookup_account"}
    assert lookup.modes == ("inline",) and manifest.job("nothing") is None


# -- requirements and plans ---------------------------------------------------------------------------


async def test_every_unmet_requirement_is_listed_in_one_error_before_the_first_call(counted: Counted) -> None:
    async with counted.client(tasks=False) as client:
        manifest = await read_manifest(client)
    with pytest.raises(RequirementsNotMet) as refused:
        manifest.check(
            Requirements(
                modes="tasks",
                jobs={
                    "ask_two": {"respond"},
                    "quick": {"respond"},
                    "missing": (),
                    "slow": Need("cancel", modes="inline"),
                    "brief": (),
                },
                protocol_versions="2025-11-25",
            )
        )
    error = refused.value
    assert error.manifest is manifest
    assert len(error.unmet) == 6, error.message
    protocol, ask_two, quick, missing, slow, brief = error.unmet
    assert "speaks MCP 2026-07-28" in protocol and "needs 2025-11-25" in protocol
    assert "TasksClientExtension" in ask_two and "It could run handles here" in ask_two
    assert "asks no questions" in quick
    assert "no such job" in missing and "ask_two" in missing
    assert "an inline call cannot cancel" in slow and "It could run handles or inline" not in slow
    assert "It could run handles or inline here" in brief
    assert all(line in error.message for line in error.unmet)
    assert not counted.calls, "nothing was called"


async def test_a_declared_fallback_is_taken_and_said(
    counted: Counted, caplog: pytest.LogCaptureFixture
) -> None:
    needs = Requirements(modes=("tasks", "handles"), jobs={"ask_two": {"respond"}, "quick": ()})
    caplog.set_level(logging.INFO, logger="handles.client")
    async with counted.client(tasks=False) as client:
        plan = (await read_manifest(client)).check(needs)
    assert dict(plan.modes) == {"ask_two": "handles", "quick": "handles"}
    assert "a declared fallback. Not tasks: this client does not declare" in plan.fallbacks["ask_two"]
    said = [record.getMessage() for record in caplog.records if record.name == "handles.client"]
    assert any("ask_two runs handles, a declared fallback" in line for line in said)
    async with counted.client() as client:
        plan = (await read_manifest(client)).check(needs)
    assert dict(plan.modes) == {"ask_two": "tasks", "quick": "tasks"} and not plan.fallbacks


async def test_needing_the_tasks_extension_without_naming_jobs(counted: Counted) -> None:
    async with counted.client() as client:
        assert not (await read_manifest(client)).check(Requirements(modes="tasks")).modes
    async with counted.client(tasks=False) as client:
        manifest = await read_manifest(client)
    with pytest.raises(RequirementsNotMet, match=r"This workflow needs tasks\. Not tasks: this client"):
        manifest.check(Requirements(modes="tasks"))
    manifest.check(Requirements(modes=("tasks", "handles")))


def test_requirements_are_checked_when_declared() -> None:
    assert Requirements(modes="tasks", jobs=["a"]).jobs == {"a": Need()}
    assert Requirements(modes="tasks", jobs={"a": "respond"}).jobs["a"] == Need("respond")
    assert Need("respond", "cancel", modes="tasks").modes == ("tasks",)
    for wrong in (
        {"modes": "task"},
        {"modes": ()},
        {"modes": ("tasks", "tasks")},
        {"modes": "tasks", "jobs": {"a": {"answer"}}},
    ):
        with pytest.raises(ValidationError):
            Requirements(**wrong)


# -- a workflow over Streamable HTTP ------------------------------------------------------------------------


def answer(_key: str, _message: str, _schema: dict[str, Any]) -> dict[str, Any]:
    return APPROVE


@pytest.mark.parametrize("declares_tasks", [True, False], ids=["tasks-client", "plain-client"])
async def test_a_workflow_runs_each_job_the_way_its_plan_chose(
    http_example: HttpExampleServer, declares_tasks: bool
) -> None:
    needs = Requirements(modes=("tasks", "handles"), jobs={"deploy_release": {"respond"}})
    extensions = [TasksClientExtension()] if declares_tasks else None
    async with Client(http_example.url, extensions=extensions) as client:
        plan = (await read_manifest(client)).check(needs)
        assert plan["deploy_release"] == ("tasks" if declares_tasks else "handles")
        assert bool(plan.fallbacks) is not declares_tasks
        deployed = await follow(
            client, "deploy_release", {"version": "9.1.0"}, prefer=plan["deploy_release"], on_input=answer
        )
    assert deployed["environment"] == "staging" and deployed["version"] == "9.1.0"


async def test_a_workflow_that_allows_inline_calls_the_plain_tool(http_example: HttpExampleServer) -> None:
    async with Client(http_example.url) as client:
        plan = (await read_manifest(client)).check(Requirements(modes="inline", jobs=["generate_report"]))
        assert plan["generate_report"] == "inline"
        result = await client.call_tool("generate_report", {"account": "acme", "months": 2})
    assert result.structured_content is not None and result.structured_content["months"] == 2


async def test_follow_refuses_a_job_the_server_does_not_list_before_any_call(counted: Counted) -> None:
    async with counted.client() as client:
        with pytest.raises(UnsupportedServerError, match="no such job"):
            await follow(client, "nope", {})
    assert not counted.calls


async def test_the_plain_tool_carries_the_job_description(inprocess_example: InProcessExample) -> None:
    server: MCPServer[Any] = inprocess_example.server
    async with Client(server) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert (tools["deploy_release"].meta or {})[JOB_META_KEY] == {
        "layout": "per_job",
        "asks_input": True,
        "plain_call": "adaptive",
    }
    assert tools["deploy_release_start"].meta is None and tools["lookup_account"].meta is None
