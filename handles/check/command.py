"""`handles check URL`: run the gates against a live server and report them for a person and for CI."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Collection
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
from mcp import StdioServerParameters

from handles.check.gates import ALL_GATES, GATES, Run
from handles.check.plan import CheckPlan, load_plan
from handles.check.report import GateResult, table, write_json, write_junit
from handles.check.wire import Caller, Server, Transcript, open_caller
from handles.client.transient import unreadable_cause
from handles.errors import ConfigurationError

UNREACHABLE = 3
"""The exit code of `handles check` and `handles manifest` when the server cannot be read at all."""


def _principal(value: str) -> tuple[str, str | None]:
    name, equals, token = value.partition("=")
    if not name or not equals:
        raise argparse.ArgumentTypeError(f"{value!r}: use NAME=TOKEN (NAME= for no token)")
    return name, token or None


def comma_list(value: str, allowed: Collection[str], what: str) -> list[str]:
    """The names of a comma-separated `value` (spaces around them ignored), each one of `allowed`."""
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in allowed]
    if unknown:
        raise argparse.ArgumentTypeError(f"{', '.join(unknown)}: not {what}; use {', '.join(allowed)}")
    return names


def add_check_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `check` command's arguments."""
    command = commands.add_parser(
        "check",
        help="prove a live server's jobs against the gates (isolation, transitions, cancellation, ...)",
        description="Drive the jobs of a live MCP server over Streamable HTTP as two principals, through the "
        "public wire only, and report each gate with the requests that showed it. Exit 0 when every "
        "selected gate passes, 1 when one fails, 3 when the server cannot be read. See docs/checking.md.",
    )
    command.add_argument("target", nargs="*", metavar="URL", help="the MCP endpoint (--stdio: -- COMMAND...)")
    command.add_argument("--stdio", action="store_true", help="serve COMMAND over stdio (one principal)")
    command.add_argument(
        "--as",
        dest="principals",
        action="append",
        type=_principal,
        default=[],
        metavar="NAME=TOKEN",
        help="a principal and its bearer token; twice: the owner of the jobs, then the other principal",
    )
    command.add_argument("--jobs", type=Path, metavar="FILE", help="checks.toml: the jobs to drive")
    gates = functools.partial(comma_list, allowed=ALL_GATES, what="a gate")
    command.add_argument("--only", type=gates, metavar="GATE[,GATE...]", help="run only these gates")
    command.add_argument("--skip", type=gates, default=[], metavar="GATE[,GATE...]", help="skip these")
    command.add_argument("--list", action="store_true", help="name every gate and what it proves, and exit")
    command.add_argument("--json", type=Path, metavar="FILE", help="write one entry per gate as JSON")
    command.add_argument("--junit", type=Path, metavar="FILE", help="write a JUnit XML report")
    command.add_argument("--verbose", action="store_true", help="print the evidence of passed gates too")
    command.set_defaults(run=check)


def check(args: argparse.Namespace) -> int:
    if args.list:
        for name, gate in ALL_GATES.items():
            print(f"{name:<14} {' '.join((gate.__doc__ or '').split())}")
        return 0
    server: Server
    if args.stdio and args.target and args.jobs and not args.principals:
        server = StdioServerParameters(command=args.target[0], args=args.target[1:], env=dict(os.environ))
        principals: list[tuple[str, str | None]] = [("local", None)]
    elif len(args.target) == 1 and args.jobs and len(args.principals) == 2:
        server, principals = args.target[0], args.principals
    else:
        raise ConfigurationError(
            "handles check needs URL, --jobs FILE and two --as NAME=TOKEN (or --stdio --jobs FILE -- COMMAND)."
        )
    plan = load_plan(args.jobs)
    selected = [
        name for name in args.only or [*GATES, *(["load"] if plan.load else [])] if name not in args.skip
    ]
    try:
        results = anyio.run(run_gates, server, principals, plan, selected)
    except Exception as exc:
        if (cause := unreadable_cause(exc)) is None:
            raise
        print(f"handles check: could not read {' '.join(args.target)}: {cause}", file=sys.stderr)
        return UNREACHABLE
    print(table(results, verbose=args.verbose))
    if args.json:
        write_json(results, args.json)
    if args.junit:
        write_junit(results, args.junit)
    return 0 if all(result.passed for result in results) else 1


async def run_gates(
    server: Server, principals: list[tuple[str, str | None]], plan: CheckPlan, selected: list[str]
) -> list[GateResult]:
    """Each selected gate's result: the first principal owns the jobs, the second (if any) tries to reach them."""
    transcript = Transcript()
    others: list[tuple[str | None, str | None]] = [*principals[1:], (None, None)]
    (owner, token), (other, other_token) = principals[0], others[0]
    async with AsyncExitStack() as stack:

        async def connected(name: str | None, token: str | None, mode: str, era: str = "") -> Caller | None:
            if name is None:
                return None
            return await stack.enter_async_context(open_caller(name + era, server, token, transcript, mode))

        callers = [
            await connected(owner, token, "tasks"),
            await connected(other, other_token, "tasks"),
            await connected(owner, token, "auto", " (no Tasks extension)"),
            await connected(owner, token, "legacy", " (2025-11-25)"),
            await connected(other, other_token, "legacy", " (2025-11-25)"),
        ]
        again = functools.partial(open_caller, f"{owner} (a new connection)", server, token, transcript)
        run = await Run.read(plan, callers, again)
        results, tty = [], sys.stderr.isatty()  # on a terminal, one line rewritten per gate
        for index, name in enumerate(selected, start=1):
            line = f"[{index}/{len(selected)}] {name}..."
            print(f"\r\x1b[K{line}" if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)
            try:
                findings = await ALL_GATES[name](run)
            except Exception as exc:  # a gate that cannot finish fails, saying why
                results.append(GateResult(name, False, [f"FAILED: the gate stopped: {exc!r}"]))
                continue
            evidence = findings.evidence or ["nothing to test: no planned job has the tools this gate drives"]
            results.append(GateResult(name, not findings.failed, evidence, findings.applied))
        if tty:
            print("\r\x1b[K", end="", file=sys.stderr, flush=True)
        return results
