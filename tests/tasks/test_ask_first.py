"""Questions a job needs answered before it starts: in-band (MRTR) for callers that can take them,
through `q0` and the respond tool / `tasks/update` for every other caller. Nothing starts unanswered."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.server.mcpserver import MCPServer
from mcp_types import ElicitRequestParams, ElicitResult
from pydantic import BaseModel, Field

from handles import Handles, JobContext
from handles.ask_first import FIRST_KEY, AskFirst
from handles.client.tasks import TasksClientExtension, get_task, update_task
from tests.support import wait_task
from tests.tasks.app import tasks_config


class Confirm(BaseModel):
    confirm: bool = Field(description="Really purge?")
    reason: str = Field(description="Why, for the audit log.")


class Purged(BaseModel):
    prefix: str
    reason: str


async def purge(ctx: JobContext, prefix: str) -> Purged:
    """Purge every cached entry under a prefix."""
    answer: Confirm = ctx.first_answer
    if not answer.confirm:
        raise ValueError("unconfirmed purges never run")
    return Purged(prefix=prefix, reason=answer.reason)


@pytest.fixture
async def server(tmp_path: Path, tasks_key: str) -> AsyncIterator[tuple[Handles, MCPServer[Any]]]:
    jobs = Handles(tasks_config(tmp_path / "data", tasks_key))
    jobs.job(ask_first=AskFirst(lambda args: f"Purge everything under {args['prefix']!r}?", Confirm))(purge)
    mcp_server: MCPServer[Any] = MCPServer("ask-first", extensions=[jobs.tasks_extension()])
    jobs.bind(mcp_server)
    async with jobs.running():
        yield jobs, mcp_server


def stored_jobs(jobs: Handles) -> int:
    return len(jobs.service.store.repo.list_jobs(limit=100))


def answering(content: dict[str, Any] | None, seen: list[ElicitRequestParams]) -> Any:
    async def callback(_ctx: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        seen.append(params)
        if content is None:
            return ElicitResult(action="decline")
        return ElicitResult(action="accept", content=content)

    return callback


async def test_a_client_with_elicitation_is_asked_in_band_and_nothing_is_stored_first(server: Any) -> None:
    jobs, mcp_server = server
    async with Client(mcp_server, elicitation_callback=answering(None, [])) as client:
        first = await client.session.call_tool("purge", {"prefix": "tmp/"}, allow_input_required=True)
        assert first.result_type == "input_required"
        request = first.input_requests[FIRST_KEY]
        assert request.params.message == "Purge everything under 'tmp/'?"
        assert set(request.params.requested_schema["properties"]) == {"confirm", "reason"}
        assert stored_jobs(jobs) == 0, "nothing is stored before the answer"

        answer = {FIRST_KEY: ElicitResult(action="accept", content={"confirm": True, "reason": "disk full"})}
        done = await client.session.call_tool("purge", {"prefix": "tmp/"}, input_responses=answer)
        assert not done.is_error
        assert done.structured_content == {"prefix": "tmp/", "reason": "disk full"}
        assert stored_jobs(jobs) == 1


async def test_the_sdk_client_drives_the_round_trip_through_its_elicitation_callback(server: Any) -> None:
    _, mcp_server = server
    seen: list[ElicitRequestParams] = []
    callback = answering({"confirm": True, "reason": "cleanup"}, seen)
    async with Client(mcp_server, elicitation_callback=callback) as client:
        result = await client.call_tool("purge", {"prefix": "cache/"})
    assert result.structured_content == {"prefix": "cache/", "reason": "cleanup"}
    assert len(seen) == 1 and seen[0].message == "Purge everything under 'cache/'?"


async def test_declining_or_a_wrong_answer_starts_nothing(server: Any) -> None:
    jobs, mcp_server = server
    async with Client(mcp_server, elicitation_callback=answering(None, [])) as client:
        declined = await client.call_tool("purge", {"prefix": "x/"})
        assert declined.is_error and "was not started" in declined.content[0].text  # type: ignore[union-attr]
        wrong = {FIRST_KEY: ElicitResult(action="accept", content={"confirm": "yes"})}
        refused = await client.session.call_tool("purge", {"prefix": "x/"}, input_responses=wrong)
        assert refused.is_error and "does not fit" in refused.content[0].text  # type: ignore[union-attr]
    assert stored_jobs(jobs) == 0


async def test_without_elicitation_the_job_waits_in_input_required_for_q0(server: Any) -> None:
    _, mcp_server = server
    async with Client(mcp_server) as client:  # declares no elicitation
        handoff = (await client.call_tool("purge", {"prefix": "logs/"})).structured_content
        assert handoff["status"] == "input_required"
        assert handoff["input_requests"][FIRST_KEY]["message"] == "Purge everything under 'logs/'?"
        handle = handoff["handle"]
        started = (await client.call_tool("purge_start", {"prefix": "old/"})).structured_content
        assert started["status"] == "input_required" and FIRST_KEY in started["input_requests"]
        assert "purge_respond" in started["next"] and "does not start until you answer" in started["next"]
        progress = (await client.call_tool("purge_progress", {"handle": handle})).structured_content
        assert progress["attempts"] == 0, "it has not run"
        reply = await client.call_tool(
            "purge_respond",
            {"handle": handle, "responses": {FIRST_KEY: {"confirm": True, "reason": "rotate"}}},
        )
        assert reply.structured_content["accepted"] == [FIRST_KEY]
        done = (
            await client.call_tool("purge_fetch", {"handle": handle, "wait_seconds": 10})
        ).structured_content
        assert done["status"] == "completed" and done["result"] == {"prefix": "logs/", "reason": "rotate"}
        assert (await client.call_tool("purge_progress", {"handle": handle})).structured_content[
            "attempts"
        ] == 1


async def test_tasks_clients_get_it_before_the_task_or_on_the_task(server: Any) -> None:
    _, mcp_server = server
    seen: list[ElicitRequestParams] = []
    # With elicitation: asked in-band first, then the retry creates the task, which the extension follows.
    async with Client(
        mcp_server,
        extensions=[TasksClientExtension()],
        elicitation_callback=answering({"confirm": True, "reason": "tasks"}, seen),
    ) as client:
        result = await client.call_tool("purge", {"prefix": "a/"})
        assert result.structured_content == {"prefix": "a/", "reason": "tasks"}
        assert len(seen) == 1

    # Without elicitation: the task is created waiting, with q0 among its input requests.
    async with Client(mcp_server, extensions=[TasksClientExtension()]) as client:
        created = await client.session.call_tool("purge", {"prefix": "b/"}, allow_claimed=True)
        assert created.result_type == "task" and created.status == "input_required"
        task = await get_task(client.session, created.task_id)
        assert task.status == "input_required"
        assert task.input_requests[FIRST_KEY]["params"]["message"] == "Purge everything under 'b/'?"
        await update_task(
            client.session,
            created.task_id,
            {FIRST_KEY: {"action": "accept", "content": {"confirm": True, "reason": "later"}}},
        )
        task = await wait_task(client, created.task_id, "completed", "failed", "cancelled")
        assert task.status == "completed", task
        assert task.result["structuredContent"] == {"prefix": "b/", "reason": "later"}
