"""Jobs written for the tests, served in-process through the official client: failures, waiting, expiry.

These need what the example jobs do not have: an unexpected exception carrying a
secret, a job that holds until the test releases it, and a clock the test moves.
The last test runs the example server itself on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import fastmcp.exceptions
import pytest
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent
from pydantic import BaseModel

from example_server.server import build_server, create_jobs
from handles import Handles, JobContext, JobFailed
from handles.errors import ConfigurationError
from handles.tool_layout import LAYOUTS, ToolLayout, ToolNames
from tests.support import MovableClock, ToolClient, connect, handles_config, job_id_of

SECRET = "hunter2-db-password"
GATES: dict[str, asyncio.Event] = {}


class Answer(BaseModel):
    value: int
    note: str


def declare_jobs(jobs: Handles) -> None:
    @jobs.job(retention=timedelta(hours=2))
    async def explode(ctx: JobContext, note: str) -> Answer:
        """Fails with an unexpected exception whose text carries a secret."""
        await ctx.progress(1, 2, "half way")
        raise RuntimeError(f"could not reach postgres://admin:{SECRET}@db.internal:5432 ({note})")

    @jobs.job
    async def refuse(ctx: JobContext, reason: str) -> Answer:
        """Fails on purpose, with a message meant for the caller."""
        raise JobFailed(f"Refused: {reason}")

    @jobs.job
    async def complain(ctx: JobContext) -> Answer:
        """Ends with a tool-level error."""
        raise ToolError("The input file is empty; upload a file with at least one row.")

    @jobs.job
    async def complain_fastmcp(ctx: JobContext) -> Answer:
        """Ends with a tool-level error, raised as a FastMCP tool would."""
        raise fastmcp.exceptions.ToolError("The input file is empty; upload a file with at least one row.")

    @jobs.job
    async def asks_undeclared(ctx: JobContext) -> Answer:
        """Asks through a helper, though not declared to ask (a mistake no look at its own code can see)."""
        return await _confirmed(ctx)

    @jobs.job(retention=timedelta(minutes=10))
    async def gated(ctx: JobContext, gate: str) -> Answer:
        """Holds, without reporting anything, until the test sets its gate."""
        await GATES[gate].wait()
        return Answer(value=42, note=gate)


async def _confirmed(context: JobContext) -> Answer:
    return await context.ask("Go ahead?", Answer)


@dataclass
class Custom:
    jobs: Handles
    client: ToolClient
    clock: MovableClock
    key: str
    layout: ToolLayout

    def tool(self, job: str, verb: str) -> str:
        return ToolNames.of(self.layout).name(job, verb)


@pytest.fixture(params=LAYOUTS)
async def custom(request: pytest.FixtureRequest, tmp_path: Path, signing_key: str) -> AsyncIterator[Custom]:
    """The test jobs in-process, in each tool layout."""
    layout: ToolLayout = request.param
    clock = MovableClock()
    jobs = Handles(
        handles_config(
            tmp_path,
            [signing_key],
            max_wait_seconds=1.5,
            cancel_grace_seconds=0.5,
        ),
        clock=clock,
    )
    declare_jobs(jobs)
    server: MCPServer[Any] = MCPServer("custom")
    jobs.bind(server, layout=layout)
    try:
        async with connect(server, forbidden=[signing_key, SECRET]) as client:
            yield Custom(jobs, client, clock, signing_key, layout)
    finally:
        for gate in GATES.values():
            gate.set()
        await jobs.aclose()
        GATES.clear()


async def start(client: ToolClient, job: str, **arguments: object) -> str:
    reply = await client.call(f"{job}_start", arguments)
    assert not reply.is_error, reply.data
    return str(reply["handle"])


# -- failures ----------------------------------------------------------------------------------


async def test_an_unexpected_exception_fails_the_job_with_a_sanitized_message(
    custom: Custom, caplog: pytest.LogCaptureFixture
) -> None:
    client = custom.client
    with caplog.at_level(logging.ERROR, logger="handles.runtime"):
        handle = await start(client, "explode", note="nightly")
        failed = await client.call(custom.tool("explode", "fetch"), {"handle": handle, "wait_seconds": 10})
    assert failed.is_error and failed["status"] == "failed"
    assert failed["result"] is None and failed["tool_error"] is None
    error = failed["error"]
    assert error["code"] == -32603
    assert error["data"]["reason"] == "exception"
    reference = error["data"]["reference"]
    assert f"reference {reference}" in error["message"]
    for leak in (SECRET, "postgres://", "RuntimeError", "Traceback", "nightly", ".py", "line "):
        assert leak not in failed.text, f"{leak!r} leaked to the caller"
    assert "Do not retry blindly" in failed["next"]

    progress = await client.call(custom.tool("explode", "progress"), {"handle": handle})
    assert not progress.is_error, "progress reports the failure; it is not itself an error"
    assert progress["status"] == "failed" and progress["status_message"] == error["message"]
    assert progress["poll_after_ms"] is None

    # Operators find the details in the server log under the same reference.
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert reference in logged and SECRET in logged and "Traceback" in logged


def test_a_job_that_asks_without_declaring_it_is_refused_where_it_is_declared(tmp_path: Path) -> None:
    jobs = Handles(handles_config(tmp_path, ["k" * 40]))
    with pytest.raises(ConfigurationError) as refused:

        @jobs.job
        async def approve(ctx: JobContext, version: str) -> Answer:
            if version:
                return await ctx.ask(f"Ship {version}?", Answer)
            return Answer(value=0, note="")

    assert str(refused.value) == (
        "Job 'approve' calls ctx.ask() but is not declared to ask: declare it with "
        "@jobs.job(asks_input=True), which gives it the respond tool that takes the answers."
    )


async def test_asking_undeclared_fails_the_job_as_the_servers_configuration_and_logs_the_fix(
    custom: Custom, caplog: pytest.LogCaptureFixture
) -> None:
    """A job that asks through a helper is only found asking when it runs: the caller is told it is the
    server's configuration (not an unexpected error, not theirs), and the log names the fix."""
    with caplog.at_level(logging.ERROR, logger="handles.runtime"):
        handle = await start(custom.client, "asks_undeclared")
        failed = await custom.client.call(
            custom.tool("asks_undeclared", "fetch"), {"handle": handle, "wait_seconds": 10}
        )
    assert failed.is_error and failed["status"] == "failed"
    error = failed["error"]
    assert error["data"]["reason"] == "server_configuration"
    reference = error["data"]["reference"]
    assert error["message"] == (
        "The job cannot run because of this server's configuration, not because of your request: it asks "
        "a question, but the server does not take answers for it. Starting it again fails the same way "
        f"until the server's operator fixes it (reference {reference})."
    )
    assert "unexpected" not in failed.text and "reconcile" not in failed["next"]
    assert "server's operator" in failed["next"] and "reference" in failed["next"]
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert reference in logged and "@jobs.job(asks_input=True)" in logged and "asks_undeclared" in logged


async def test_job_failed_shows_the_authors_message(custom: Custom) -> None:
    handle = await start(custom.client, "refuse", reason="the account is closed")
    failed = await custom.client.call(custom.tool("refuse", "fetch"), {"handle": handle, "wait_seconds": 10})
    assert failed.is_error and failed["status"] == "failed"
    assert failed["error"]["message"] == "Refused: the account is closed"
    assert failed["error"]["data"] == {"reason": "job_failed"}


@pytest.mark.parametrize("job", ["complain", "complain_fastmcp"])
async def test_a_tool_error_ends_completed_and_is_error(custom: Custom, job: str) -> None:
    """The SDK's `ToolError` and FastMCP's end a job alike."""
    handle = await start(custom.client, job)
    done = await custom.client.call(custom.tool(job, "fetch"), {"handle": handle, "wait_seconds": 10})
    assert done.is_error and done["status"] == "completed"
    assert done["tool_error"] == "The input file is empty; upload a file with at least one row."
    assert done["result"] is None and done["error"] is None
    cancel = await custom.client.call(custom.tool(job, "cancel"), {"handle": handle})
    assert cancel["status"] == "completed" and cancel["cancel_requested"] is False


# -- no invented results, honest waiting ---------------------------------------------------------------


async def test_fetch_never_invents_a_result_before_completion(custom: Custom) -> None:
    client = custom.client
    GATES["g1"] = asyncio.Event()
    handle = await start(client, "gated", gate="g1")
    for wait in (0, 0.3):
        early = await client.call(custom.tool("gated", "fetch"), {"handle": handle, "wait_seconds": wait})
        assert not early.is_error and early["status"] == "working"
        assert early["result"] is None and early["tool_error"] is None and early["error"] is None
        assert early["next"].startswith("The result is not ready yet.")
    GATES["g1"].set()
    done = await client.call(custom.tool("gated", "fetch"), {"handle": handle, "wait_seconds": 3})
    assert done["status"] == "completed" and done["result"] == {"value": 42, "note": "g1"}


async def test_long_poll_waits_while_nothing_changes_and_is_capped(custom: Custom) -> None:
    client = custom.client
    GATES["g2"] = asyncio.Event()
    handle = await start(client, "gated", gate="g2")
    await client.call(
        custom.tool("gated", "progress"), {"handle": handle, "wait_seconds": 1}
    )  # past the claim
    began = time.monotonic()
    quiet = await client.call(custom.tool("gated", "progress"), {"handle": handle, "wait_seconds": 0.6})
    assert 0.5 <= time.monotonic() - began < 2.5 and quiet["status"] == "working"
    began = time.monotonic()
    capped = await client.call(custom.tool("gated", "fetch"), {"handle": handle, "wait_seconds": 30})
    elapsed = time.monotonic() - began
    assert 1.4 <= elapsed < 3, (
        f"wait_seconds is capped by max_wait_seconds (1.5 s here), took {elapsed:.2f} s"
    )
    assert capped["status"] == "working" and capped["result"] is None

    async def release_soon() -> None:
        await asyncio.sleep(0.3)
        GATES["g2"].set()

    task = asyncio.create_task(release_soon())
    began = time.monotonic()
    done = await client.call(custom.tool("gated", "fetch"), {"handle": handle, "wait_seconds": 3})
    await task
    assert done["status"] == "completed" and time.monotonic() - began < 1.5


async def test_cancel_a_job_that_ignores_cancellation(custom: Custom) -> None:
    """`gated` never checks `ctx.cancelled`: it is interrupted at its await and still ends `cancelled`."""
    GATES["g3"] = asyncio.Event()
    handle = await start(custom.client, "gated", gate="g3")
    await custom.client.call(custom.tool("gated", "progress"), {"handle": handle, "wait_seconds": 1})
    cancelled = await custom.client.call(custom.tool("gated", "cancel"), {"handle": handle})
    assert cancelled["cancel_requested"] is True
    still = await custom.client.call(custom.tool("gated", "progress"), {"handle": handle})
    assert still["status"] == "working", "it keeps its grace period (0.5 s here) to stop by itself"
    began = time.monotonic()
    final = await custom.client.call(custom.tool("gated", "fetch"), {"handle": handle, "wait_seconds": 3})
    assert final["status"] == "cancelled" and final["result"] is None
    assert time.monotonic() - began < 2
    assert final["status_message"] == "Cancelled at the caller's request."


# -- expiry ------------------------------------------------------------------------------------------


async def test_a_handle_expires_with_its_retention(custom: Custom) -> None:
    client = custom.client
    GATES["g4"] = asyncio.Event()
    GATES["g4"].set()
    handle = await start(client, "gated", gate="g4")
    done = await client.call(custom.tool("gated", "fetch"), {"handle": handle, "wait_seconds": 3})
    assert done["status"] == "completed"

    custom.clock.offset = timedelta(minutes=10, seconds=1)
    await client.assert_expired("gated", handle, "10 minutes")

    # The sweeper deletes it (the background pass may get there first, once the clock has moved).
    await custom.jobs.runtime.sweep_once()
    assert custom.jobs.service.store.repo.get(job_id_of(handle, custom.key)) is None
    gone = await client.call(custom.tool("gated", "fetch"), {"handle": handle})
    assert gone["error"] == "expired_handle", "a deleted job's handle still says it expired"
    made_up = await client.call(custom.tool("gated", "fetch"), {"handle": "not-a-real-handle"})
    assert made_up["error"] == "unknown_handle"


# -- the client's own checks ---------------------------------------------------------------------------


async def test_the_client_checks_structured_results_against_the_output_schema(custom: Custom) -> None:
    """The SDK client refuses a result whose structured content breaks the listed output schema."""
    session = custom.client.client.session
    await custom.client.tools()
    bad = CallToolResult(
        content=[TextContent(type="text", text="{}")], structured_content={"handle": 7, "status": "sleeping"}
    )
    with pytest.raises(RuntimeError, match="Invalid structured content"):
        await session.validate_tool_result("gated_start", bad)
    missing = CallToolResult(content=[TextContent(type="text", text="{}")])
    with pytest.raises(RuntimeError, match="did not return structured content"):
        await session.validate_tool_result(custom.tool("gated", "progress"), missing)


# -- the example server on PostgreSQL -------------------------------------------------------------------


async def test_example_server_on_postgresql(postgres_url: str, tmp_path: Path, signing_key: str) -> None:
    jobs = create_jobs(handles_config(tmp_path, [signing_key], database_url=postgres_url, auto_migrate=True))
    try:
        async with connect(build_server(jobs), forbidden=[signing_key]) as client:
            report = await start(client, "generate_report", account="pg", months=2)
            deploy = await start(client, "deploy_release", version="5.0.0")
            done = await client.call("generate_report_fetch", {"handle": report, "wait_seconds": 20})
            assert done["status"] == "completed" and done["result"]["account"] == "pg"
            await client.wait_status("deploy_release", deploy, "input_required")
            answered = await client.call(
                "deploy_release_respond",
                {"handle": deploy, "responses": {"q1": {"approve": True, "environment": "production"}}},
            )
            assert answered["accepted"] == ["q1"]
            deployed = await client.call("deploy_release_fetch", {"handle": deploy, "wait_seconds": 20})
            assert deployed["status"] == "completed" and deployed["result"]["environment"] == "production"
            export = await start(client, "export_dataset", rows=100)
            await client.call("export_dataset_cancel", {"handle": export})
            final = await client.call("export_dataset_fetch", {"handle": export, "wait_seconds": 20})
            assert final["status"] == "cancelled"
    finally:
        await jobs.aclose()
