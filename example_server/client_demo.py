"""Follow one job of the example server to its end with `handles.client`.

    python -m example_server.client_demo generate_report '{"account": "acme", "months": 6}'
    python -m example_server.client_demo deploy_release '{"version": "2.4.0"}' --answer '{"approve": true, "environment": "staging"}'
    python -m example_server.client_demo export_dataset '{"rows": 1000}' --url http://127.0.0.1:8000/mcp

Without `--url` it starts `python -m example_server` over stdio (with `HANDLES_DEV_MODE=1` unless
`HANDLES_SECRET_KEYS` is set, so the handle key persists in the server's data directory).

The job is recorded in a journal (`--journal`, default `.handles/client-journal.db`) under a key
(`--key`, default: derived from the job and its arguments) before the client waits. Stop the client
at any moment (even `kill -9`) and run the same command again: it resumes the same job instead of
starting another one, and once the job has ended it prints the recorded outcome (`--forget` starts
afresh). Progress goes to stderr; the result is printed to stdout as JSON.

Exit status: 0 result, 1 the job failed, ended with a tool error or was cancelled, 2 deadline passed
(the job goes on unless --cancel-on-abandon), 3 the server could not be reached or refused the token,
4 other errors.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from mcp import StdioServerParameters

from handles.client import (
    AuthenticationRefusedError,
    Connect,
    ConnectionLostError,
    DeadlineExceeded,
    FollowError,
    JobCancelledError,
    JobFailedError,
    JobToolError,
    Journal,
    Progress,
    connect,
    follow,
)


def connector(url: str | None, token: str | None) -> Connect:
    """A factory of connected clients that declare the Tasks extension: over HTTP, or the server over stdio."""
    if url is not None:
        return connect(url, token=token)  # a 401/403 raises AuthenticationRefusedError, not retried
    env = dict(os.environ)
    if not env.get("HANDLES_SECRET_KEYS"):
        env.setdefault("HANDLES_DEV_MODE", "1")
    return connect(StdioServerParameters(command=sys.executable, args=["-m", "example_server"], env=env))


def show_progress(update: Progress) -> None:
    amount = f" {update.done:g}/{update.total:g}" if update.done is not None and update.total else ""
    print(
        f"[{update.key}] {update.status}{amount} {update.message or ''}".rstrip(), file=sys.stderr, flush=True
    )


def answerer(preset: dict[str, Any] | None) -> Callable[[str, str, dict[str, Any]], dict[str, Any] | None]:
    """Answer every question with `preset`, or ask on the terminal (decline when there is none)."""

    def answer(key: str, message: str, schema: dict[str, Any]) -> dict[str, Any] | None:
        print(f"[question {key}] {message}", file=sys.stderr, flush=True)
        if preset is not None:
            return preset
        if not sys.stdin.isatty():
            print("  no terminal and no --answer: declining", file=sys.stderr)
            return None
        answers: dict[str, Any] = {}
        for name, field in (schema.get("properties") or {}).items():
            choices = field.get("enum")
            hint = (
                "/".join(choices)
                if choices
                else ("y/n" if field.get("type") == "boolean" else field.get("type"))
            )
            text = input(f"  {field.get('description') or name} [{hint}] (empty declines): ").strip()
            if not text:
                return None
            if field.get("type") == "boolean":
                answers[name] = text.lower().startswith("y")
            elif field.get("type") in ("integer", "number"):
                answers[name] = float(text) if field["type"] == "number" else int(text)
            else:
                answers[name] = text
        return answers

    return answer


async def run(args: argparse.Namespace) -> int:
    arguments = json.loads(args.arguments)
    digest = hashlib.sha256(json.dumps([args.job, arguments], sort_keys=True).encode()).hexdigest()[:12]
    key = args.key or f"{args.job}-{digest}"
    journal = Journal(args.journal)
    if args.forget:
        journal.forget(key)
    entry = journal.get(key)
    if entry is not None:
        print(f"[{key}] resuming: {entry.state} (journal {args.journal})", file=sys.stderr, flush=True)
    try:
        # A factory rather than one client: follow opens its own, and a new one after a lost connection.
        result = await follow(
            connector(args.url, args.token),
            args.job,
            arguments,
            key=key,
            journal=journal,
            on_progress=show_progress,
            on_input=answerer(json.loads(args.answer) if args.answer else None),
            deadline=args.deadline,
            cancel_on_abandon=args.cancel_on_abandon,
            prefer=args.prefer,
            server_id=args.url or "stdio:example_server",
        )
    except (JobFailedError, JobToolError, JobCancelledError) as outcome:
        print(f"[{key}] {type(outcome).__name__}: {outcome}", file=sys.stderr)
        return 1
    except DeadlineExceeded as late:
        print(f"[{key}] {late}", file=sys.stderr)
        return 2
    except (ConnectionLostError, AuthenticationRefusedError) as lost:
        print(f"[{key}] {lost}", file=sys.stderr)
        return 3
    except FollowError as error:
        print(f"[{key}] {type(error).__name__}: {error}", file=sys.stderr)
        return 4
    print(json.dumps(result, ensure_ascii=False), flush=True)
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m example_server.client_demo",
        description="Follow one job of the example server to its end with handles.client.",
    )
    parser.add_argument("job", help="generate_report, deploy_release or export_dataset")
    parser.add_argument("arguments", nargs="?", default="{}", help="the job's arguments as a JSON object")
    parser.add_argument(
        "--url", help="Streamable HTTP endpoint (default: start the example server over stdio)"
    )
    parser.add_argument("--token", help="bearer token for --url")
    parser.add_argument("--journal", default=os.path.join(".handles", "client-journal.db"))
    parser.add_argument("--key", help="name of this unit of work (default: from the job and its arguments)")
    parser.add_argument("--forget", action="store_true", help="drop the key from the journal first")
    parser.add_argument("--prefer", choices=["auto", "tasks", "handles"], default="auto")
    parser.add_argument("--deadline", type=float, help="give up after this many seconds")
    parser.add_argument("--cancel-on-abandon", action="store_true", help="cancel the job when giving up")
    parser.add_argument("--answer", help="JSON object answering every question the job asks")
    args = parser.parse_args(argv)
    sys.exit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
