"""End-to-end demo: start the example server over stdio and drive it with the official `mcp` client.

Run it with `python -m example_server.demo`. It starts a report and watches its
progress, answers a deployment's approval question, cancels an export mid-way,
and fetches every result, printing what the server answers at each step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import tempfile
from typing import Any

from mcp import Client, StdioServerParameters
from mcp_types import CallToolResult


def _show(label: str, payload: dict[str, Any], *keys: str) -> None:
    shown = {k: payload[k] for k in keys if k in payload}
    print(f"  {label:<10} {json.dumps(shown, ensure_ascii=False)}")


async def _call(client: Client, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result: CallToolResult = await client.call_tool(tool, arguments)
    if result.structured_content is None:
        raise SystemExit(f"{tool} failed: {result.content[0].text if result.content else result}")  # type: ignore[union-attr]
    return result.structured_content


async def _follow(client: Client, job: str, handle: str) -> dict[str, Any]:
    """Long-poll progress until the job leaves `working`."""
    while True:
        state = await _call(client, f"{job}_progress", {"handle": handle, "wait_seconds": 10})
        _show("progress", state, "status", "status_message", "progress")
        if state["status"] != "working":
            return state


async def run_demo(job_seconds: float) -> None:
    data_dir = tempfile.mkdtemp(prefix="handles-demo-")
    env = dict(os.environ)
    env.update(
        HANDLES_DATA_DIR=data_dir,
        HANDLES_SECRET_KEYS=secrets.token_urlsafe(48),
        EXAMPLE_JOB_SECONDS=str(job_seconds),
    )
    params = StdioServerParameters(command=sys.executable, args=["-m", "example_server"], env=env)
    print(f"Starting the example server over stdio (state in {data_dir}/handles.db)")
    async with Client(params) as client:
        tools = await client.list_tools()
        print("Tools:", ", ".join(sorted(t.name for t in tools.tools)))

        print("\n1. An ordinary quick tool")
        _show(
            "lookup", await _call(client, "lookup_account", {"account": "acme"}), "account", "plan", "region"
        )

        print("\n2. generate_report: start, watch progress, fetch")
        started = await _call(client, "generate_report_start", {"account": "acme", "months": 6})
        _show("start", started, "status", "poll_after_ms", "expires_at")
        print(f"  next:      {started['next']}")
        await _follow(client, "generate_report", started["handle"])
        report = await _call(client, "generate_report_fetch", {"handle": started["handle"]})
        _show("fetch", report, "status", "result")

        print("\n3. deploy_release: the job asks a question mid-way")
        started = await _call(client, "deploy_release_start", {"version": "2.4.0"})
        state = await _follow(client, "deploy_release", started["handle"])
        for key, request in state["input_requests"].items():
            print(f"  question   {key}: {request['message']}")
        answer = {"q1": {"approve": True, "environment": "staging"}}
        replied = await _call(
            client, "deploy_release_respond", {"handle": started["handle"], "responses": answer}
        )
        _show("respond", replied, "status", "accepted", "ignored")
        deployed = await _call(
            client, "deploy_release_fetch", {"handle": started["handle"], "wait_seconds": 30}
        )
        _show("fetch", deployed, "status", "result")

        print("\n4. export_dataset: cancel it mid-way")
        started = await _call(client, "export_dataset_start", {"rows": 100_000})
        await _call(client, "export_dataset_progress", {"handle": started["handle"], "wait_seconds": 2})
        cancelled = await _call(client, "export_dataset_cancel", {"handle": started["handle"]})
        _show("cancel", cancelled, "status", "cancel_requested")
        final = await _call(client, "export_dataset_fetch", {"handle": started["handle"], "wait_seconds": 30})
        _show("fetch", final, "status", "status_message")

        print("\n5. A made-up handle gets a clear tool error")
        bogus = await client.call_tool("generate_report_progress", {"handle": "not-a-real-handle"})
        print(f"  isError={bogus.is_error} {bogus.content[0].text}")  # type: ignore[union-attr]
    print("\nDemo finished.")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m example_server.demo", description=__doc__)
    parser.add_argument(
        "--job-seconds", type=float, default=4.0, help="nominal length of each job (default 4)"
    )
    args = parser.parse_args()
    asyncio.run(run_demo(args.job_seconds))


if __name__ == "__main__":
    main()
