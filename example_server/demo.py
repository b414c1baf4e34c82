"""End-to-end demo: start the example server over stdio and drive it with the official `mcp` client.

Run it with `python -m example_server.demo`. It follows a report with `handles.client`
through the Tasks extension (giving up at a first deadline, then resuming the same job
from the client's journal), follows a deployment through the handle tools and answers
its approval question from a callback, then drives an export by hand with the handle
tools (start, progress, cancel, fetch), runs another to the end and reads its CSV through
the result link, printing what the server answers at each step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import tempfile
from pathlib import Path
from typing import Any

from mcp import Client, StdioServerParameters
from mcp_types import CallToolResult

from handles.client import DeadlineExceeded, Journal, Progress, TasksClientExtension, follow
from handles.results import text_of


def _show(label: str, payload: dict[str, Any], *keys: str) -> None:
    shown = {k: payload[k] for k in keys if k in payload}
    print(f"  {label:<10} {json.dumps(shown, ensure_ascii=False)}")


async def _call(client: Client, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result: CallToolResult = await client.call_tool(tool, arguments)
    if result.structured_content is None:
        raise SystemExit(f"{tool} failed: {text_of(result) or result}")
    return result.structured_content


def _show_progress(update: Progress) -> None:
    amount = f" {update.done:g}/{update.total:g}" if update.done is not None and update.total else ""
    print(f"  progress   {update.status}{amount}  {update.message or ''}".rstrip())


def _approve(key: str, message: str, schema: dict[str, Any]) -> dict[str, Any]:
    print(f"  question   {key}: {message} (fields: {', '.join(schema.get('properties', {}))})")
    answer = {"approve": True, "environment": "staging"}
    print(f"  answer     {json.dumps(answer)}")
    return answer


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
    journal = Journal(Path(data_dir) / "client-journal.db")
    async with Client(params, extensions=[TasksClientExtension()]) as client:
        tools = await client.list_tools()
        print("Tools:", ", ".join(sorted(t.name for t in tools.tools)))

        print("\n1. An ordinary quick tool")
        _show(
            "lookup", await _call(client, "lookup_account", {"account": "acme"}), "account", "plan", "region"
        )

        print("\n2. generate_report with handles.client, through the Tasks extension (tasks/get)")
        report = {"account": "acme", "months": 6}
        try:
            await follow(
                client, "generate_report", report, key="acme-report", journal=journal,
                on_progress=_show_progress, deadline=job_seconds / 4, prefer="tasks",
            )  # fmt: skip
        except DeadlineExceeded as late:
            print(f"  deadline   {late.message}")
        entry = journal.get("acme-report")
        assert entry is not None
        print(
            f"  journal    acme-report -> {entry.job} job {(entry.handle or '')[:16]}..., state {entry.state}"
        )
        print("  resuming the same key: no second start, the same job is followed to its end")
        result = await follow(
            client, "generate_report", report, key="acme-report", journal=journal,
            on_progress=_show_progress, prefer="tasks",
        )  # fmt: skip
        print(f"  result     {json.dumps(result)}")

        print(
            "\n3. deploy_release with handles.client, through the handle tools; a callback answers its question"
        )
        result = await follow(
            client, "deploy_release", {"version": "2.4.0"}, key="deploy-2.4.0", journal=journal,
            on_progress=_show_progress, on_input=_approve, prefer="handles", deadline=60,
        )  # fmt: skip
        print(f"  result     {json.dumps(result)}")

        print("\n4. export_dataset: cancel it mid-way")
        started = await _call(client, "export_dataset_start", {"rows": 100_000})
        await _call(client, "export_dataset_progress", {"handle": started["handle"], "wait_seconds": 2})
        cancelled = await _call(client, "export_dataset_cancel", {"handle": started["handle"]})
        _show("cancel", cancelled, "status", "cancel_requested")
        final = await _call(client, "export_dataset_fetch", {"handle": started["handle"], "wait_seconds": 30})
        _show("fetch", final, "status", "status_message")

        print("\n5. export_dataset to the end: the CSV comes back as a link, read with resources/read")
        started = await _call(client, "export_dataset_start", {"rows": 60_000})
        done = await _call(client, "export_dataset_fetch", {"handle": started["handle"], "wait_seconds": 30})
        link = done["result_link"]
        _show("fetch", done, "status", "result_link")
        csv = await read_link(client, link)
        lines = csv.splitlines()
        print(
            f"  read       {len(csv.encode())} bytes in {link['parts']} part(s): {len(lines) - 1} rows, first {lines[1]!r}"
        )

        print("\n6. A made-up handle gets a clear tool error")
        bogus = await client.call_tool("generate_report_progress", {"handle": "not-a-real-handle"})
        print(f"  isError={bogus.is_error} {text_of(bogus)}")
    print("\nDemo finished. Follow one job yourself (stop it at any moment, run it again: it resumes):")
    print("""  python -m example_server.client_demo generate_report '{"account": "acme", "months": 6}'""")


async def read_link(client: Client, link: dict[str, Any]) -> str:
    """A large result's text, joined from its parts (each read is one `resources/read`)."""
    uris = [link["uri"]] if link["parts"] == 1 else [f"{link['uri']}/parts/{n}" for n in range(link["parts"])]
    texts = []
    for uri in uris:
        (content,) = (await client.read_resource(uri)).contents
        texts.append(getattr(content, "text", ""))
    return "".join(texts)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m example_server.demo", description=__doc__)
    parser.add_argument(
        "--job-seconds", type=float, default=4.0, help="nominal length of each job (default 4)"
    )
    args = parser.parse_args()
    asyncio.run(run_demo(args.job_seconds))


if __name__ == "__main__":
    main()
