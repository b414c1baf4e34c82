"""`task_after`: a declaring call of a job that ends that soon gets its result as an ordinary tool result,
with no task; a job still running then becomes a task, as every declaring call does without the option.
Through the official `mcp` client with the Tasks extension declared, in-process, on the SDK's `MCPServer`
and on FastMCP 4 (the same decision, `TasksExtension.task_for_call`, on both)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastmcp import FastMCP
from mcp import Client, ClientSession
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult

from handles import Handles, JobContext
from handles.client.tasks import CreateTaskResult, DetailedTask, TasksClientExtension, get_task
from handles.errors import ConfigurationError
from handles.server.bind_fastmcp import low_level
from handles.states import Status
from tests.harness.client import abandon_once
from tests.support import count_active
from tests.tasks.app import Answers, Choice, Confirm, Done, Echo, failing, tasks_config, tool_error

pytestmark = pytest.mark.timeout(60)

SOON = timedelta(seconds=5)
"""Far longer than a job that ends at once takes on a loaded machine, far shorter than the test's timeout."""

RELEASE: dict[str, asyncio.Event] = {}


def release(name: str) -> asyncio.Event:
    return RELEASE.setdefault(name, asyncio.Event())


async def quick(ctx: JobContext, text: str) -> Echo:
    """Echo a text back at once."""
    return Echo(text=text, length=len(text))


async def held(ctx: JobContext, name: str) -> Done:
    """Wait until the test releases `name`, one step at a time."""
    while not release(name).is_set():
        await ctx.checkpoint()
        await asyncio.sleep(0.01)
    return Done(steps=1)


async def ask(ctx: JobContext) -> Answers:
    """Ask two questions, one after the other."""
    choice = await ctx.ask("Which colour?", Choice)
    confirm = await ctx.ask("Go ahead?", Confirm)
    return Answers(color=choice.color, confirm=confirm.confirm)


async def until_cancelled(ctx: JobContext) -> Done:
    """Run until cancelled."""
    while True:
        await ctx.checkpoint()
        await asyncio.sleep(0.01)


def declare(jobs: Handles) -> None:
    jobs.job(task_after=SOON)(quick)
    jobs.job(task_after=timedelta(milliseconds=100))(held)
    jobs.job(task_after=SOON)(tool_error)
    jobs.job(task_after=SOON)(failing)
    jobs.job(task_after=timedelta(milliseconds=100), asks_input=True)(ask)
    jobs.job(task_after=timedelta(seconds=30))(until_cancelled)
    jobs.job(name="quick_as_task")(quick)  # no task_after: a task at once


@asynccontextmanager
async def connected(tmp_path: Path, framework: str) -> AsyncIterator[tuple[Handles, ClientSession]]:
    """(jobs, a session of the official client declaring Tasks) against the jobs served on `framework`."""
    jobs = Handles(tasks_config(tmp_path / "data", "task-after-key-" + "k" * 32))
    declare(jobs)
    server: Any
    if framework == "mcpserver":
        server = MCPServer("task-after", extensions=[jobs.tasks_extension()])
        jobs.bind(server)
    else:
        fast: FastMCP[Any] = FastMCP("task-after")
        jobs.bind(fast)
        server = low_level(fast)
    async with jobs.running(), Client(server, extensions=[TasksClientExtension()]) as client:
        yield jobs, client.session


async def task_state(session: ClientSession, task_id: str, until: str) -> DetailedTask:
    """The task once its status is `until` (or as it is after about four seconds)."""
    for _ in range(200):
        state = await get_task(session, task_id)
        if state.status == until:
            break
        await anyio.sleep(0.02)
    return state


@pytest.fixture(params=["mcpserver", "fastmcp"])
def framework(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def stored_kinds(jobs: Handles, kind: str) -> list[Any]:
    return jobs.service.store.repo.list_jobs(kind=kind)


async def test_a_job_that_ends_within_task_after_answers_its_result_and_makes_no_task(
    tmp_path: Path, framework: str
) -> None:
    async with connected(tmp_path, framework) as (jobs, session):
        answer = await session.call_tool("quick", {"text": "inline"}, allow_claimed=True)
        assert isinstance(answer, CallToolResult), answer
        assert answer.is_error is False
        assert answer.structured_content == {"text": "inline", "length": 6}
        [job] = stored_kinds(jobs, "quick")  # stored durably all the same, and ended
        assert job.status == Status.COMPLETED.value

        # Without the option the same job becomes a task at once.
        created = await session.call_tool("quick_as_task", {"text": "t"}, allow_claimed=True)
        assert isinstance(created, CreateTaskResult)


async def test_a_job_still_running_after_task_after_becomes_a_task(tmp_path: Path, framework: str) -> None:
    name = f"held-{framework}"
    async with connected(tmp_path, framework) as (_jobs, session):
        created = await session.call_tool("held", {"name": name}, allow_claimed=True)
        assert isinstance(created, CreateTaskResult), created
        assert created.status == "working"
        release(name).set()
        state = await task_state(session, created.task_id, "completed")
        assert state.status == "completed"
        assert state.result is not None and state.result["structuredContent"] == {"steps": 1}


async def test_a_tool_error_and_a_failure_within_task_after_answer_as_an_ordinary_call(
    tmp_path: Path, framework: str
) -> None:
    async with connected(tmp_path, framework) as (jobs, session):
        refused = await session.call_tool("tool_error", {}, allow_claimed=True)
        assert isinstance(refused, CallToolResult) and refused.is_error
        assert "The input was refused" in refused.content[0].text  # type: ignore[union-attr]

        with pytest.raises(MCPError) as failed:
            await session.call_tool("failing", {}, allow_claimed=True)
        [job] = stored_kinds(jobs, "failing")
        assert job.status == Status.FAILED.value
        # The same JSON-RPC error object the task would carry in tasks/get.
        assert job.error is not None
        assert failed.value.error.code == job.error["code"]
        assert (
            failed.value.error.message == job.error["message"] == "The upstream service refused the request."
        )


async def test_a_job_that_asks_within_task_after_becomes_a_task_waiting_for_its_answer(
    tmp_path: Path, framework: str
) -> None:
    async with connected(tmp_path, framework) as (_jobs, session):
        created = await session.call_tool("ask", {}, allow_claimed=True)
        assert isinstance(created, CreateTaskResult), created
        state = await task_state(session, created.task_id, "input_required")
        assert state.status == "input_required"


async def test_a_caller_that_goes_away_within_task_after_cancels_its_job(
    tmp_path: Path, framework: str
) -> None:
    """Its task id never went out, so nobody else can follow the job: it is cancelled, as a plain call's is."""
    async with connected(tmp_path, framework) as (jobs, session):
        await abandon_once(
            lambda: session.call_tool("until_cancelled", {}, allow_claimed=True),
            lambda: bool(stored_kinds(jobs, "until_cancelled")),
        )
        repo = jobs.service.store.repo
        for _ in range(100):
            if count_active(repo) == 0:
                break
            await anyio.sleep(0.05)
        [job] = stored_kinds(jobs, "until_cancelled")
        assert job.status == Status.CANCELLED.value


def test_task_after_must_be_positive(tmp_path: Path) -> None:
    jobs = Handles(tasks_config(tmp_path / "data", "task-after-key-" + "k" * 32))
    with pytest.raises(ConfigurationError, match="task_after must be positive"):
        jobs.job(task_after=timedelta(0))(quick)
