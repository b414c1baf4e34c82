"""Sensitive arguments and answers (`SecretStr`): sealed at rest, given to the job, shown to nobody.

A job takes a `SecretStr` password and asks for a `SecretStr` token, then writes both into its
progress message, a tool error and an unexpected exception. The job gets the real values; the
SQLite file (and its WAL) never holds them in the clear; every reply, the CLI (even with
--reveal-results) and the server log show `[sensitive]` or `[redacted]` instead.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, SecretStr

from handles import Handles, JobContext
from tests.support import connect, handles_config

PASSWORD = "correct-horse-battery-staple-71"
TOKEN = "tok-9f3b2c7e5a1d"
HANDLES = Path(sys.executable).parent / "handles"


class Token(BaseModel):
    token: SecretStr
    note: str


class Login(BaseModel):
    user: str
    password_ok: bool
    token_ok: bool


def declare(jobs: Handles) -> None:
    @jobs.job(asks_input=True)
    async def login(ctx: JobContext, user: str, password: SecretStr, mode: str = "ok") -> Login:
        """Logs in with a password, then asks for a one-time token."""
        secret = password.get_secret_value()
        await ctx.progress(1, 3, f"trying {user} with {secret}")
        answer = await ctx.ask(f"Token for {user}?", Token)
        token = answer.token.get_secret_value()
        await ctx.progress(2, 3, f"got token {token} (note {answer.note})")
        if mode == "tool_error":
            raise ToolError(f"login refused for {secret} / {token}")
        if mode == "crash":
            raise RuntimeError(f"unexpected: {secret} {token}")
        return Login(user=user, password_ok=secret == PASSWORD, token_ok=token == TOKEN)


def stored_bytes(data_dir: Path) -> bytes:
    return b"".join(path.read_bytes() for path in sorted(data_dir.glob("handles.db*")))


async def test_sensitive_values_are_sealed_given_to_the_job_and_shown_to_nobody(
    tmp_path: Path, signing_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    data_dir = tmp_path / "data"
    jobs = Handles(handles_config(data_dir, [signing_key], progress_flush_seconds=0))
    declare(jobs)
    server: MCPServer[Any] = MCPServer("sensitive")
    jobs.bind(server)
    seen: list[str] = []
    caplog.set_level(logging.INFO)
    try:
        async with connect(server, forbidden=[PASSWORD, TOKEN]) as client:
            tools = await client.tools()
            schema = tools["login_start"].input_schema["properties"]["password"]
            assert schema.get("writeOnly") is True  # a client may mask it

            handles = {}
            for mode in ("ok", "tool_error", "crash"):
                started = await client.call(
                    "login_start", {"user": "ada", "password": PASSWORD, "mode": mode}
                )
                handle = started["handle"]
                asked = await client.wait_status("login", handle, "input_required")
                seen.append(json.dumps(asked.data))
                question = asked["input_requests"]["q1"]
                assert question["requested_schema"]["properties"]["token"] == {
                    "type": "string",
                    "title": "Token",
                    "writeOnly": True,
                }
                assert "[redacted]" in asked["status_message"] or asked["status_message"] == "Token for ada?"
                answered = await client.call(
                    "login_respond",
                    {"handle": handle, "responses": {"q1": {"token": TOKEN, "note": "from sms"}}},
                )
                assert answered["accepted"] == ["q1"]
                handles[mode] = handle

            done = await client.call("login_fetch", {"handle": handles["ok"], "wait_seconds": 20})
            assert done["result"] == {"user": "ada", "password_ok": True, "token_ok": True}
            refused = await client.call("login_fetch", {"handle": handles["tool_error"], "wait_seconds": 20})
            assert refused["tool_error"] == "login refused for [redacted] / [redacted]"
            crashed = await client.call("login_fetch", {"handle": handles["crash"], "wait_seconds": 20})
            assert crashed["status"] == "failed"
            for reply in (done, refused, crashed):
                seen.append(json.dumps(reply.data))
            progress = await client.call("login_progress", {"handle": handles["ok"]})
            assert progress["status_message"] == "Completed."

            # The same idempotency key with another password is the same job: secrets are not compared.
            first = await client.call(
                "login_start", {"user": "bo", "password": PASSWORD, "idempotency_key": "k1"}
            )
            again = await client.call(
                "login_start", {"user": "bo", "password": "another-password-1", "idempotency_key": "k1"}
            )
            assert again["created"] is False and again["handle"] == first["handle"]
            await client.call("login_cancel", {"handle": first["handle"]})
    finally:
        await jobs.aclose()

    assert "[redacted]" in caplog.text  # the crash's traceback was logged, with the values replaced
    for text in [*seen, caplog.text]:
        assert PASSWORD not in text and TOKEN not in text
    stored = stored_bytes(data_dir)
    assert stored and PASSWORD.encode() not in stored and TOKEN.encode() not in stored

    environment = dict(os.environ, HANDLES_DATA_DIR=str(data_dir), HANDLES_SECRET_KEYS=signing_key)
    environment.pop("HANDLES_DATABASE_URL", None)
    listed = subprocess.run(
        [str(HANDLES), "jobs", "list", "--json"], capture_output=True, text=True, env=environment, timeout=60
    )
    assert listed.returncode == 0, listed.stderr
    for job in json.loads(listed.stdout):
        shown = subprocess.run(
            [str(HANDLES), "jobs", "show", job["id"], "--reveal-results"],
            capture_output=True,
            text=True,
            env=environment,
            timeout=60,
        )
        assert shown.returncode == 0, shown.stderr
        assert PASSWORD not in shown.stdout and TOKEN not in shown.stdout
        assert "[sensitive]" in shown.stdout


async def test_a_sealed_value_whose_key_was_removed_fails_the_job_with_a_clear_reason(
    tmp_path: Path, signing_key: str
) -> None:
    from handles.store import JobRepository

    data_dir = tmp_path / "data"
    queued_only = Handles(handles_config(data_dir, [signing_key], run_workers=False))
    declare(queued_only)
    server: MCPServer[Any] = MCPServer("sensitive")
    queued_only.bind(server)
    try:
        async with connect(server) as client:
            await client.call("login_start", {"user": "ada", "password": PASSWORD})
    finally:
        await queued_only.aclose()

    rotated = Handles(handles_config(data_dir, ["n" * 48]))  # the key that sealed the password is gone
    declare(rotated)
    repo = JobRepository(f"sqlite:///{(data_dir / 'handles.db').as_posix()}")
    try:
        async with rotated.running():
            for _ in range(200):
                job = _only_job(repo)
                if job.status == "failed":
                    break
                await asyncio.sleep(0.05)
    finally:
        repo.dispose()
    assert job.status == "failed" and job.error is not None
    assert job.error["data"]["reason"] == "sealed_value_unreadable"
    assert "HANDLES_SECRET_KEYS" in job.error["message"] and PASSWORD not in json.dumps(job.error)


def _only_job(repo: Any) -> Any:
    from sqlmodel import Session, select

    from handles.store import JobRecord

    with Session(repo.engine) as session:
        (job,) = session.exec(select(JobRecord)).all()
        return job
