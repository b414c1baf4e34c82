"""Caller mistakes in the follow tools' arguments, through the example server over Streamable HTTP:
an answer that answers no question the job asked, and a `wait_seconds` that is not a number."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.support import ToolClient

APPROVE = {"approve": True, "environment": "staging"}


async def asked(client: ToolClient, version: str) -> str:
    """The handle of a deploy_release job that waits for its answer to q1."""
    reply = await client.call("deploy_release_start", {"version": version})
    assert not reply.is_error, reply.data
    handle = str(reply["handle"])
    await client.wait_status("deploy_release", handle, "input_required")
    return handle


async def test_an_answer_to_no_question_the_job_asked_is_a_caller_mistake(
    as_principal: Callable[[str], Any],
) -> None:
    async with as_principal("alice") as alice:
        handle = await asked(alice, "5.0.0")
        for responses in ({"q9": APPROVE}, {"q9": APPROVE, "Q1": APPROVE}, {}):
            reply = await alice.call("deploy_release_respond", {"handle": handle, "responses": responses})
            assert reply.is_error and reply.structured is None, responses
            assert reply["error"] == "invalid_arguments" and reply["open_questions"] == ["q1"], reply.data
            for key in responses:
                assert key in reply["message"], (key, reply["message"])
            assert "q1" in reply["message"] and "q1" in reply["next"], reply.data
            assert "deploy_release_respond" in reply["next"], reply.data
        still = await alice.call("deploy_release_progress", {"handle": handle})
        assert still["status"] == "input_required" and list(still["input_requests"]) == ["q1"], (
            "nothing stored"
        )

        # One question it asked among unknown ones: answered, the others listed as ignored (as before).
        mixed = await alice.call(
            "deploy_release_respond", {"handle": handle, "responses": {"q1": APPROVE, "q9": APPROVE}}
        )
        assert not mixed.is_error and mixed["accepted"] == ["q1"] and mixed["ignored"] == ["q9"], mixed.data

        # Sent again (a retry after a lost reply): the question was asked, so it is ignored, not an error.
        again = await alice.call("deploy_release_respond", {"handle": handle, "responses": {"q1": APPROVE}})
        assert not again.is_error and again["accepted"] == [] and again["ignored"] == ["q1"], again.data

        # Nothing left to answer: an unknown key says so, and where to follow the job instead.
        late = await alice.call("deploy_release_respond", {"handle": handle, "responses": {"q9": APPROVE}})
        assert late.is_error and late["error"] == "invalid_arguments", late.data
        assert late["open_questions"] == [] and "no open questions" in late["message"], late.data
        assert "deploy_release_progress" in late["next"], late.data
        done = await alice.call("deploy_release_fetch", {"handle": handle, "wait_seconds": 20})
        assert done["status"] == "completed" and done["result"]["environment"] == "staging"


async def test_a_boolean_wait_seconds_is_refused_like_a_string(as_principal: Callable[[str], Any]) -> None:
    async with as_principal("alice") as alice:
        handle = await asked(alice, "5.1.0")
        for tool in ("deploy_release_progress", "deploy_release_fetch"):
            as_text = await alice.call(tool, {"handle": handle, "wait_seconds": "soon"})
            assert as_text.is_error and as_text["error"] == "invalid_arguments", as_text.data
            assert "wait_seconds" in as_text["message"] and "number" in as_text["message"], as_text.data
            assert tool in as_text["next"], as_text.data
            for flag in (True, False):
                reply = await alice.call(tool, {"handle": handle, "wait_seconds": flag})
                assert reply.is_error and reply["error"] == as_text["error"], (tool, flag, reply.data)
                assert reply["next"] == as_text["next"], "the same advice: which arguments, of what types"
                assert reply["message"] == (
                    f"Invalid arguments for {tool}: wait_seconds: should be a valid number, "
                    f"not {str(flag).lower()} (expected number >= 0)."
                ), reply["message"]
            for number in (0, 1, 0.5, "1"):
                reply = await alice.call(tool, {"handle": handle, "wait_seconds": number})
                assert not reply.is_error and reply["status"] == "input_required", (tool, number, reply.data)
        await alice.call("deploy_release_cancel", {"handle": handle})
