"""`handles.client.follow` against real servers in-process: both faces, polling, deadlines, input,
abandonment, and the journal's promise that one key starts at most one job."""

from __future__ import annotations

import importlib
import itertools
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from unittest.mock import AsyncMock

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT, CallToolResult

from example_server.server import build_server, create_jobs
from handles.client import (
    AnswerRejectedError,
    ConnectionLostError,
    DeadlineExceeded,
    InputRequiredError,
    JobCancelledError,
    JobFailedError,
    JobLostError,
    JobToolError,
    Journal,
    JournalConflict,
    JournalEntry,
    OutcomeUnknownError,
    Progress,
    UnsupportedServerError,
    arguments_digest,
    connect,
    follow,
)
from handles.client.tasks import TasksClientExtension
from tests.client.conftest import Counted
from tests.support import InProcessExample, handles_config

pytestmark = pytest.mark.timeout(60)

FACES = ["tasks", "handles"]
POLL_SECONDS = 0.2  # the test jobs' poll_after
TOLERANCE = 0.03


async def status_of(client: Client, job: str, handle: str) -> str:
    reply = await client.call_tool(f"{job}_progress", {"handle": handle})
    assert reply.structured_content is not None, reply
    return str(reply.structured_content["status"])


async def wait_for_status(client: Client, job: str, handle: str, status: str) -> None:
    with anyio.fail_after(10):
        while await status_of(client, job, handle) != status:
            await anyio.sleep(0.05)


# -- one job, two faces ------------------------------------------------------------------------------


async def test_the_tasks_face_and_the_handle_face_give_the_same_result(
    inprocess_example: InProcessExample, journal: Journal
) -> None:
    arguments = {"account": "acme", "months": 3}
    async with Client(inprocess_example.server, extensions=[TasksClientExtension()]) as client:
        by_tasks = await follow(
            client, "generate_report", arguments, key="t", journal=journal, prefer="tasks"
        )
        by_handles = await follow(
            client, "generate_report", arguments, key="h", journal=journal, prefer="handles"
        )
        # The SDK's own Tasks path (a declaring tools/call resolved by TasksClientExtension) agrees.
        direct = await client.call_tool("generate_report", arguments)
    assert by_tasks == by_handles == direct.structured_content
    assert by_tasks["months"] == 3 and len(by_tasks["revenue_by_month"]) == 3
    assert len(inprocess_example.jobs.service.store.repo.list_jobs(kind="generate_report")) == 3


@pytest.mark.parametrize("face", FACES)
async def test_each_face_is_used_as_asked(counted: Counted, face: str) -> None:
    async with counted.client() as client:
        result = await follow(client, "slow", {"seconds": 0.5}, prefer=face)  # type: ignore[arg-type]
    assert result == {"steps": 10}
    assert counted.jobs_of("slow") == 1
    assert len(counted.calls["start"]) == 1, "the job is created through slow_start (idempotent)"
    if face == "tasks":
        assert counted.calls["tasks/get"] and not counted.calls["progress"]
    else:
        assert counted.calls["progress"] and not counted.calls["tasks/get"]


async def test_auto_uses_tasks_when_both_sides_support_it_and_handles_otherwise(counted: Counted) -> None:
    async with counted.client(tasks=True) as client:
        await follow(client, "quick", {"text": "a"})
    assert counted.calls["tasks/get"] and not counted.calls["progress"]
    counted.calls.clear()
    async with counted.client(tasks=False) as client:
        assert await follow(client, "quick", {"text": "b"}) == {"text": "b", "length": 1}
        with pytest.raises(UnsupportedServerError, match="TasksClientExtension"):
            await follow(client, "quick", {"text": "c"}, prefer="tasks")
    assert counted.calls["progress"] and not counted.calls["tasks/get"]
    counted.calls.clear()
    # connect() builds clients that declare the extension (and take pushed states: no tasks/get at all).
    assert await follow(connect(counted.server), "quick", {"text": "d"}) == {"text": "d", "length": 1}
    assert counted.calls["start"] and not counted.calls["progress"] and not counted.calls["tasks/get"]


# -- polling -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("face", ["auto", *FACES])
async def test_progress_has_done_and_total_on_either_face(counted: Counted, face: str) -> None:
    updates: list[Progress] = []
    async with counted.client() as client:
        await follow(client, "slow", {"seconds": 1.0}, prefer=face, on_progress=updates.append)  # type: ignore[arg-type]
    if face != "handles":
        assert counted.calls["tasks/get"], "auto should follow through the Tasks extension here"
    numbers = [(u.done, u.total) for u in updates if u.done is not None]
    assert numbers, updates
    assert all(total == 10 and done is not None and 1 <= done <= 10 for done, total in numbers)


@pytest.mark.parametrize("face", FACES)
async def test_polls_are_never_closer_than_the_servers_interval(counted: Counted, face: str) -> None:
    """The job reports progress every 0.1 s for 1 s: the client still polls at most every 0.2 s (+ jitter)."""
    seconds = 1.0
    async with counted.client() as client:
        await follow(client, "slow", {"seconds": seconds}, prefer=face)  # type: ignore[arg-type]
    polls = counted.calls["tasks/get" if face == "tasks" else "progress"]
    moments = counted.calls["start"] + polls
    gaps = [later - earlier for earlier, later in itertools.pairwise(moments)]
    assert min(gaps) >= POLL_SECONDS - TOLERANCE, gaps
    assert 3 <= len(polls) <= seconds / POLL_SECONDS + 3, len(polls)


async def test_a_long_poll_replaces_polling_while_nothing_changes(counted: Counted) -> None:
    """On the handle face a quiet job costs one held request, not one per interval (0.2 s: ~7 in 1.5 s)."""
    async with counted.client() as client:
        with pytest.raises(DeadlineExceeded):
            # slow(60) reports progress every 6 s: nothing changes within the deadline
            await follow(client, "slow", {"seconds": 60}, prefer="handles", deadline=1.5, long_poll_seconds=5)
    assert len(counted.calls["progress"]) <= 3, counted.calls["progress"]


def _reserved(
    journal: Journal, key: str, arguments: dict[str, Any], created_via: str, state: str
) -> tuple[JournalEntry, bool]:
    """A journal entry of a `quick` job on the Tasks test server, as a run that stopped after writing it left it."""
    return journal.reserve(
        key,
        server="inprocess:handles-tasks-test",
        job="quick",
        arguments_digest=arguments_digest("quick", arguments),
        created_via=created_via,
        state=state,
    )


async def _abandoned_at_the_deadline(client: Any, face: str, **options: Any) -> DeadlineExceeded:
    """The error of following a 20 s `slow` job with a 1 s deadline (past the start's reply) on `face`."""
    with pytest.raises(DeadlineExceeded) as late:
        await follow(client, "slow", {"seconds": 20}, prefer=face, deadline=1.0, **options)  # type: ignore[arg-type]
    return late.value


# -- the deadline --------------------------------------------------------------------------------------


@pytest.mark.parametrize("face", FACES)
async def test_the_deadline_holds_while_the_job_keeps_reporting_progress(counted: Counted, face: str) -> None:
    reports: list[Progress] = []
    async with counted.client() as client:
        began = time.monotonic()
        late = await _abandoned_at_the_deadline(client, face, on_progress=reports.append)
        elapsed = time.monotonic() - began
        assert 1.0 <= elapsed < 1.6, elapsed
        assert late.handle and late.status == "working" and not late.cancelled
        assert "follow the same key again" in late.message
        assert await status_of(client, "slow", late.handle) == "working", "the job goes on"
    assert reports and reports[0].status == "working"


@pytest.mark.parametrize("face", FACES)
async def test_following_the_same_key_after_the_deadline_resumes_the_same_job(
    counted: Counted, face: str, journal: Journal
) -> None:
    # The deadline passes after the start's reply (so the error carries the handle) and long before the
    # job ends; 0.3 s once did not cover the first call's start on a loaded CI host (the error then rightly
    # had no handle, and said the start may not have been sent).
    async with counted.client() as client:
        with pytest.raises(DeadlineExceeded) as late:
            await follow(
                client, "slow", {"seconds": 3.0}, key="k", journal=journal, prefer=face, deadline=1.0
            )  # type: ignore[arg-type]
        result = await follow(client, "slow", {"seconds": 3.0}, key="k", journal=journal, prefer=face)  # type: ignore[arg-type]
    assert result == {"steps": 10}
    assert counted.jobs_of("slow") == 1
    entry = journal.get("k")
    assert entry is not None and entry.handle == late.value.handle and entry.state == "completed"


@pytest.mark.parametrize("face", FACES)
async def test_a_deadline_with_cancel_on_abandon_cancels_the_job(counted: Counted, face: str) -> None:
    async with counted.client() as client:
        late = await _abandoned_at_the_deadline(client, face, cancel_on_abandon=True)
        assert late.cancelled and late.handle
        await wait_for_status(client, "slow", late.handle, "cancelled")


# -- input ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("face", FACES)
async def test_questions_go_to_the_callback_and_its_answers_go_back(counted: Counted, face: str) -> None:
    asked: list[tuple[str, str, list[str]]] = []

    def answer_sync(key: str, message: str, schema: dict[str, Any]) -> dict[str, Any]:
        asked.append((key, message, sorted(schema["properties"])))
        return {"color": "teal"} if key == "q1" else {"confirm": True}

    async def answer_async(key: str, message: str, schema: dict[str, Any]) -> dict[str, Any]:
        await anyio.sleep(0)
        return answer_sync(key, message, schema)

    callback = answer_sync if face == "tasks" else answer_async
    async with counted.client() as client:
        result = await follow(client, "ask_two", {"topic": "paint"}, prefer=face, on_input=callback)  # type: ignore[arg-type]
    assert result == {"color": "teal", "confirm": True}
    assert sorted(asked) == [
        ("q1", "Which colour for paint?", ["color"]),
        ("q2", "Go ahead with paint?", ["confirm"]),
    ], "each question is asked once"


@pytest.mark.parametrize("face", FACES)
async def test_declining_a_question_cancels_the_job(counted: Counted, face: str) -> None:
    async with counted.client() as client:
        with pytest.raises(JobCancelledError) as cancelled:
            await follow(client, "ask_two", {"topic": "ink"}, prefer=face, on_input=lambda *_: None)  # type: ignore[arg-type]
        assert cancelled.value.handle
        assert await status_of(client, "ask_two", cancelled.value.handle) == "cancelled"


@pytest.mark.parametrize("face", FACES)
async def test_a_question_without_a_callback_is_raised_and_the_job_waits(counted: Counted, face: str) -> None:
    async with counted.client() as client:
        with pytest.raises(InputRequiredError) as waiting:
            await follow(client, "ask_two", {"topic": "tea"}, prefer=face)  # type: ignore[arg-type]
        assert sorted(q.key for q in waiting.value.questions) == ["q1", "q2"]
        assert waiting.value.handle
        assert await status_of(client, "ask_two", waiting.value.handle) == "input_required"


@pytest.mark.parametrize("face", FACES)
async def test_an_answer_that_does_not_fit_the_schema_is_rejected(counted: Counted, face: str) -> None:
    async with counted.client() as client:
        with pytest.raises(AnswerRejectedError, match="requested schema") as rejected:
            await follow(client, "ask_two", {"topic": "pen"}, prefer=face, on_input=lambda *_: {"color": 7})  # type: ignore[arg-type]
        assert rejected.value.handle
        assert await status_of(client, "ask_two", rejected.value.handle) == "input_required"


# -- abandonment ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("cancel_on_abandon", [True, False])
async def test_a_caller_that_stops_waiting_cancels_the_job_only_when_asked(
    counted: Counted, face: str, cancel_on_abandon: bool, journal: Journal
) -> None:
    async with counted.client() as client:
        async with anyio.create_task_group() as group:

            async def follow_slow() -> None:
                await follow(
                    client,
                    "slow",
                    {"seconds": 20},
                    key="abandoned",
                    journal=journal,
                    prefer=face,  # type: ignore[arg-type]
                    cancel_on_abandon=cancel_on_abandon,
                )

            group.start_soon(follow_slow)
            await anyio.sleep(0.6)
            group.cancel_scope.cancel()
        entry = journal.get("abandoned")
        assert entry is not None and entry.handle
        if cancel_on_abandon:
            await wait_for_status(client, "slow", entry.handle, "cancelled")
        else:
            await anyio.sleep(0.3)
            assert await status_of(client, "slow", entry.handle) == "working"


# -- one key, one job -------------------------------------------------------------------------------------


class LosesFirstStartAnswer(Client):
    """A client whose first `<job>_start` reaches the server but whose answer is lost on the way back."""

    lost = 0

    async def call_tool(self, name: str, *args: Any, **kwargs: Any) -> CallToolResult:
        result = await super().call_tool(name, *args, **kwargs)
        if name.endswith("_start") and not self.lost:
            self.lost += 1
            raise MCPError(code=CONNECTION_CLOSED, message="Connection closed")
        return result


@pytest.mark.parametrize("face", FACES)
async def test_a_start_whose_answer_was_lost_is_resent_with_the_same_idempotency_key(
    counted: Counted, face: str
) -> None:
    async with LosesFirstStartAnswer(counted.server, extensions=[TasksClientExtension()]) as client:
        result = await follow(client, "quick", {"text": "once"}, prefer=face)  # type: ignore[arg-type]
        assert client.lost == 1
    assert result == {"text": "once", "length": 4}
    assert len(counted.calls["start"]) == 2, "the start was sent twice"
    assert counted.jobs_of("quick") == 1, "but only one job exists"


async def test_a_restarted_client_resends_a_start_it_never_heard_back_from(
    counted: Counted, journal: Journal
) -> None:
    """The process died after journaling the idempotency key and sending the start, before the answer."""
    arguments = {"text": "crash"}
    async with counted.client() as client:
        entry, _ = _reserved(journal, "k", arguments, "start", "starting")
        sent = await client.call_tool("quick_start", {**arguments, "idempotency_key": entry.idempotency_key})
        assert sent.structured_content is not None
        result = await follow(client, "quick", arguments, key="k", journal=journal)
    assert result == {"text": "crash", "length": 5}
    assert counted.jobs_of("quick") == 1
    recorded = journal.get("k")
    assert recorded is not None and recorded.handle == sent.structured_content["handle"]


async def test_an_ended_job_is_answered_from_the_journal(counted: Counted, journal: Journal) -> None:
    async with counted.client() as client:
        first = await follow(client, "quick", {"text": "x"}, key="k", journal=journal)
        calls = {name: len(moments) for name, moments in counted.calls.items()}
        again = await follow(client, "quick", {"text": "x"}, key="k", journal=journal)
        assert {name: len(moments) for name, moments in counted.calls.items()} == calls, "nothing was sent"
        assert again == first
        with pytest.raises(JournalConflict, match="different arguments"):
            await follow(client, "quick", {"text": "y"}, key="k", journal=journal)
        with pytest.raises(JournalConflict, match="different job"):
            await follow(client, "slow", {"text": "x"}, key="k", journal=journal)
        journal.forget("k")
        assert await follow(client, "quick", {"text": "y"}, key="k", journal=journal) == {
            "text": "y",
            "length": 1,
        }
    assert counted.jobs_of("quick") == 2


# -- outcomes -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("face", FACES)
async def test_failed_jobs_and_tool_errors_raise_and_are_recorded(
    counted: Counted, face: str, journal: Journal
) -> None:
    async with counted.client() as client:
        for _ in range(2):  # the second time from the journal
            with pytest.raises(JobFailedError) as failed:
                await follow(client, "failing", key="f", journal=journal, prefer=face)  # type: ignore[arg-type]
            assert failed.value.error["code"] == -32603
            assert failed.value.error["message"] == "The upstream service refused the request."
            assert failed.value.handle
            with pytest.raises(JobToolError, match=r"The input was refused: nothing to do\."):
                await follow(client, "tool_error", key="e", journal=journal, prefer=face)  # type: ignore[arg-type]
    assert counted.jobs_of("failing") == counted.jobs_of("tool_error") == 1


@pytest.mark.parametrize("face", FACES)
async def test_a_handle_the_server_does_not_know_is_lost_not_restarted(
    counted: Counted, face: str, journal: Journal
) -> None:
    _reserved(journal, "k", {"text": "z"}, "start", "starting")
    journal.set_handle("k", "not-a-real-handle", "working")
    async with counted.client() as client:
        with pytest.raises(JobLostError):
            await follow(client, "quick", {"text": "z"}, key="k", journal=journal, prefer=face)  # type: ignore[arg-type]
    assert counted.jobs_of("quick") == 0


# -- a Tasks server without start tools ----------------------------------------------------------------------


async def test_without_a_start_tool_the_task_is_created_once_and_never_guessed(
    counted: Counted, journal: Journal
) -> None:
    for name in counted.jobs.specs:
        counted.server.remove_tool(f"{name}_start")
    async with counted.client() as client:
        assert await follow(client, "quick", {"text": "t"}, key="k", journal=journal) == {
            "text": "t",
            "length": 1,
        }
        assert len(counted.calls["tools/call quick"]) == 1
        entry = journal.get("k")
        assert entry is not None and entry.created_via == "call" and entry.state == "completed"

        # A create an earlier run sent without ever learning its outcome is not sent again.
        _reserved(journal, "lost", {"text": "u"}, "call", "creating")
        with pytest.raises(OutcomeUnknownError, match="forget"):
            await follow(client, "quick", {"text": "u"}, key="lost", journal=journal)
        lost = journal.get("lost")
        assert lost is not None and lost.state == "unknown"

        async with counted.client(tasks=False) as plain:
            with pytest.raises(UnsupportedServerError):
                await follow(plain, "quick", {"text": "v"})
    assert len(counted.calls["tools/call quick"]) == 1
    assert counted.jobs_of("quick") == 1


# -- lost connections -------------------------------------------------------------------------------------


class FailsToObserve(Client):
    """A client whose every observation of a job (progress or tasks/get) times out."""

    async def call_tool(self, name: str, *args: Any, **kwargs: Any) -> CallToolResult:
        if name.endswith("_progress"):
            raise MCPError(code=REQUEST_TIMEOUT, message="Request timed out")
        return await super().call_tool(name, *args, **kwargs)


@pytest.mark.parametrize("face", FACES)
async def test_a_connection_that_stays_lost_is_reported_and_the_job_kept(
    counted: Counted, face: str, journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing_get = AsyncMock(side_effect=MCPError(code=REQUEST_TIMEOUT, message="Request timed out"))
    async with FailsToObserve(counted.server, extensions=[TasksClientExtension(push=False)]) as client:
        # The Tasks face calls get_task: patch it where the face looks it up.
        monkeypatch.setattr(importlib.import_module("handles.client.faces"), "get_task", failing_get)
        with pytest.raises(ConnectionLostError, match="after 2 attempts") as lost:
            await follow(client, "quick", {"text": "q"}, key="k", journal=journal, prefer=face, retries=1)  # type: ignore[arg-type]
        monkeypatch.undo()
        assert lost.value.handle
        result = await follow(client, "quick", {"text": "q"}, key="k", journal=journal, prefer="tasks")
    assert result == {"text": "q", "length": 1}
    assert counted.jobs_of("quick") == 1


async def test_with_a_factory_a_failed_connection_is_replaced(counted: Counted) -> None:
    opened: list[Client] = []

    @asynccontextmanager
    async def connect() -> AsyncIterator[Client]:
        # The first connection loses its first start answer; the next ones work.
        kind = LosesFirstStartAnswer if not opened else Client
        async with kind(counted.server, extensions=[TasksClientExtension()]) as client:
            opened.append(client)
            yield client

    assert await follow(connect, "ask_two", {"topic": "x"}, on_input=lambda k, *_: (
        {"color": "red"} if k == "q1" else {"confirm": False}
    )) == {"color": "red", "confirm": False}  # fmt: skip
    assert len(opened) == 2
    assert len(counted.calls["start"]) == 2 and counted.jobs_of("ask_two") == 1


# -- the compact tool layout ---------------------------------------------------------------------------


async def test_follow_finds_the_shared_tools_of_a_compact_server(tmp_path: Path, signing_key: str) -> None:
    """`follow` reads tools/list: on a compact server it follows through jobs_progress, jobs_respond, jobs_fetch."""
    jobs = create_jobs(handles_config(tmp_path / "data", [signing_key]))
    server = build_server(jobs, layout="compact")
    try:
        async with Client(server) as client:  # no Tasks extension: the handle tools it is
            report = await follow(client, "generate_report", {"account": "acme", "months": 2}, key="r")
            deployed = await follow(
                client,
                "deploy_release",
                {"version": "7.0.0"},
                key="d",
                on_input=lambda *_: {"approve": True, "environment": "staging"},
            )
            with pytest.raises(AnswerRejectedError, match=r"q1\.approve: required"):
                await follow(client, "deploy_release", {"version": "7.0.1"}, key="x", on_input=lambda *_: {})
        async with Client(server, extensions=[TasksClientExtension()]) as client:
            by_handles = await follow(
                client, "generate_report", {"account": "acme", "months": 2}, key="h", prefer="handles"
            )
    finally:
        await jobs.aclose()
    assert report["account"] == "acme" and len(report["revenue_by_month"]) == 2
    assert deployed["environment"] == "staging"
    assert by_handles == report
