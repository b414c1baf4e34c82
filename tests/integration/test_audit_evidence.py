"""Audit evidence outlives its job: archived when the job is deleted, exported as JSON lines, swept on its own.

On an SQLite file and on PostgreSQL, through the official client: a job that asks a question (with
a sensitive field) and runs a durable step completes; another is cancelled by its principal, a third
by an operator with the CLI. When their retention ends the sweep deletes them and archives their
evidence in the same transaction: who started, answered and cancelled, the steps with their
receipts, the claims and the outcome, and none of the arguments, answers or results. The evidence
is exported by `handles audit export` and deleted when its own retention ends.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel, SecretStr

from handles import Handles, HandlesConfig, JobContext
from handles.store.audit import receipt
from tests.support import LOCAL_PRINCIPAL, MovableClock, connect, handles_config

PIN = "pin-8841-secret"
HANDLES = Path(sys.executable).parent / "handles"
DAY = timedelta(days=1)


class Approval(BaseModel):
    approve: bool
    pin: SecretStr


def declare(jobs: Handles) -> None:
    @jobs.job(asks_input=True, retention=DAY)
    async def release(ctx: JobContext, version: str) -> dict[str, str]:
        """Asks for approval, then publishes in a durable step."""
        answer = await ctx.ask(f"Release {version}?", Approval)
        published = await ctx.step("publish", lambda: {"url": f"https://example.test/{version}"})
        return {"version": version, "url": published["url"], "approved": str(answer.approve)}

    @jobs.job(retention=DAY)
    async def wait(ctx: JobContext, seconds: float) -> dict[str, float]:
        """Waits until cancelled."""
        await asyncio.sleep(seconds)
        return {"waited": seconds}


async def test_evidence_is_archived_with_the_deletion_exported_and_swept(
    tmp_path: Path, signing_key: str, database_url: str
) -> None:
    clock = MovableClock()
    config = handles_config(
        tmp_path / "data",
        [signing_key],
        database_url=database_url,
        auto_migrate=True,
        sweep_interval_seconds=3600,
    )
    jobs = Handles(config, clock=clock)
    declare(jobs)
    server: MCPServer[Any] = MCPServer("audit")
    jobs.bind(server)
    try:
        async with connect(server) as client:
            release = (await client.call("release_start", {"version": "4.2.0"}))["handle"]
            await client.wait_status("release", release, "input_required")
            await client.call(
                "release_respond", {"handle": release, "responses": {"q1": {"approve": True, "pin": PIN}}}
            )
            done = await client.call("release_fetch", {"handle": release, "wait_seconds": 20})
            assert done["status"] == "completed"
            mine = (await client.call("wait_start", {"seconds": 60}))["handle"]
            await client.call("wait_cancel", {"handle": mine})
            theirs = (await client.call("wait_start", {"seconds": 60}))["handle"]
            await client.wait_status("wait", theirs, "working")
            environment = cli_environment(config)
            cancelled = subprocess.run(
                [str(HANDLES), "jobs", "cancel", theirs, "--by", "oncall-ana"],
                capture_output=True,
                text=True,
                env=environment,
                timeout=60,
            )
            assert cancelled.returncode == 0, cancelled.stderr
            for handle in (mine, theirs):
                final = await client.call("wait_fetch", {"handle": handle, "wait_seconds": 20})
                assert final["status"] == "cancelled"

        live = export(environment, "--live")
        assert {record["kind"] for record in live} == {"release", "wait"} and export(environment) == []

        clock.offset = DAY + timedelta(minutes=1)  # past retention: the sweep deletes and archives
        counts = await jobs.runtime.sweep_once()
        assert counts["deleted"] == 3
    finally:
        await jobs.aclose()

    records = export(environment)
    assert len(records) == 3 and all(record["archived_at"] for record in records)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_kind.setdefault(record["kind"], []).append(record)
    (archived,) = by_kind["release"]
    assert archived["started_by"] == LOCAL_PRINCIPAL
    (question,) = archived["questions"]
    assert question["answered_by"] == LOCAL_PRINCIPAL and question["fields_answered"] == ["approve", "pin"]
    (step,) = archived["steps"]
    assert step["name"] == "publish" and step["status"] == "completed"
    assert step["receipt"] == receipt({"url": "https://example.test/4.2.0"})
    assert archived["outcome"]["status"] == "completed" and archived["outcome"]["result_receipt"]
    assert archived["claims"] and archived["claims"][0]["attempt"] == 1
    cancellers = sorted(record["cancel_requested_by"] for record in by_kind["wait"])
    assert cancellers == ["local:local", "operator:oncall-ana"]
    dumped = json.dumps(records)
    assert PIN not in dumped and "4.2.0" not in dumped.replace(
        "Release 4.2.0?", ""
    )  # no arguments or results
    assert hashlib.sha256(PIN.encode()).hexdigest() not in dumped
    assert export(environment, "--job", archived["job_id"])[0]["job_id"] == archived["job_id"]

    # The evidence has its own retention: past it, the sweep deletes it too.
    later = Handles(HandlesConfig(**{**config.__dict__, "audit_retention_seconds": 1.0}), clock=clock)
    declare(later)
    clock.offset = DAY + timedelta(days=400)
    try:
        counts = await later.runtime.sweep_once()
        assert counts["evidence_deleted"] == 3
    finally:
        await later.aclose()
    assert export(environment) == []


def cli_environment(config: HandlesConfig) -> dict[str, str]:
    environment = dict(
        os.environ, HANDLES_DATA_DIR=str(config.data_dir), HANDLES_SECRET_KEYS=config.secret_keys[0]
    )
    environment["HANDLES_DATABASE_URL"] = config.database_url
    if not config.database_url:
        environment.pop("HANDLES_DATABASE_URL")
    return environment


def export(environment: dict[str, str], *options: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [str(HANDLES), "audit", "export", *options],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]
