"""`follow` and the official client while the server's operator switches are on: with the Tasks kill
switch a declaring call gets the job's handle (or its result) instead of a task, and `follow` still
reaches the result; a paused job kind is a `StartRefusedError` carrying the retry hint, and the key
stays free for a later start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult

from handles.client import Journal, StartRefusedError, follow
from handles.client.tasks import TasksClientExtension
from handles.switches import TASKS, paused_switch
from tests.client.conftest import Counted

pytestmark = pytest.mark.timeout(60)


def set_switch(counted: Counted, name: str, *, engaged: bool) -> None:
    """Set a switch in the store, as `handles` does, and have this node read it again at once."""
    service = counted.jobs.service
    service.store.repo.set_switch(name, engaged=engaged, by="test", retry_after_seconds=45)
    service.switches.invalidate()


def without_start_tools(counted: Counted) -> None:
    """Leave the plain tools only, so `follow` creates through `tools/call <job>` (the Tasks face)."""
    for name in counted.jobs.specs:
        counted.server.remove_tool(f"{name}_start")


async def test_a_tasks_only_job_answers_its_handle_at_once_to_a_declaring_call(counted: Counted) -> None:
    set_switch(counted, TASKS, engaged=True)
    async with counted.client() as client:
        answer = await client.session.call_tool("only_task", {}, allow_claimed=True)
        assert isinstance(answer, CallToolResult) and not answer.is_error
        handoff = answer.structured_content
        assert handoff is not None and handoff["status"] == "working"
        assert handoff["next"].startswith("No task was created for this call (new tasks are switched off)")
        assert "only_task_progress" in handoff["next"]
    async with Client(counted.server) as plain:  # not declaring: still told to declare the extension
        with pytest.raises(MCPError) as refused:
            await plain.call_tool("only_task", {})
        assert refused.value.error.code == -32021


async def test_follow_reaches_the_result_of_a_job_that_got_no_task(counted: Counted, tmp_path: Path) -> None:
    without_start_tools(counted)
    set_switch(counted, TASKS, engaged=True)
    journal = Journal(tmp_path / "journal.db")

    def answer(key: str, _message: str, _schema: dict[str, Any]) -> dict[str, Any]:
        return {"color": "teal"} if key == "q1" else {"confirm": True}

    async with counted.client() as client:
        assert await follow(client, "only_task", key="a", journal=journal) == {"steps": 1}
        result = await follow(client, "ask_two", {"topic": "ink"}, key="b", journal=journal, on_input=answer)
        assert result == {"color": "teal", "confirm": True}
    assert counted.jobs_of("only_task") == counted.jobs_of("ask_two") == 1
    assert counted.calls["tasks/get"], "the handed-back handle is followed as a taskId"
    entry = journal.get("b")
    assert entry is not None and entry.handle and entry.state == "completed"


@pytest.mark.parametrize("create", ["start", "call"])
async def test_a_paused_job_is_a_start_refusal_with_its_retry_hint(
    counted: Counted, tmp_path: Path, create: str
) -> None:
    if create == "call":
        without_start_tools(counted)
    set_switch(counted, paused_switch("quick"), engaged=True)
    journal = Journal(tmp_path / "journal.db")
    async with Client(counted.server, extensions=[TasksClientExtension()]) as client:
        with pytest.raises(StartRefusedError) as refused:
            await follow(client, "quick", {"text": "x"}, key="k", journal=journal)
        assert refused.value.error["error"] == "paused"
        assert refused.value.error["retryable"] is True and refused.value.error["retry_after_seconds"] == 45
        assert journal.get("k") is None, "nothing was started: the key is free"
        assert counted.jobs_of("quick") == 0

        set_switch(counted, paused_switch("quick"), engaged=False)
        assert await follow(client, "quick", {"text": "x"}, key="k", journal=journal) == {
            "text": "x",
            "length": 1,
        }
