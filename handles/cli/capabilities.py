"""`handles manifest URL`: a server's offer, against a workflow's needs."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from handles.check.command import UNREACHABLE, comma_list
from handles.check.report import aligned, one_line
from handles.client.follow import connect
from handles.client.manifest import MODES, VERBS, Manifest, Requirements, RequirementsNotMet, read_manifest
from handles.client.transient import unreadable_cause


def _modes(value: str) -> list[str]:
    return comma_list(value, MODES, "a mode")


def _required_job(value: str) -> tuple[str, list[str]]:
    name, _, verbs = value.partition(":")
    return name, comma_list(verbs, VERBS, "a verb")


def manifest_lines(found: Manifest) -> list[str]:
    """`handles manifest` for people: the server, protocol, Tasks extension and tasks designs, then a row per job."""
    named = " ".join(part for part in (found.server_name, found.server_version) if part) or "(unnamed)"
    if found.tasks_usable:
        tasks = "offered and declared: usable (" + ", ".join(found.task_operations) + ")"
    elif not found.tasks_offered:
        tasks = "not offered by the server"
    else:
        tasks = "offered, but not usable on this connection"
    negotiated = (
        "server/discover: no session" if found.negotiated_by == "discover" else "an initialize handshake"
    )
    designs = [
        f"{design} ({len(found.older_task_tools)} tools run as its tasks)"
        if design == "2025-11-25"
        else design
        for design in found.tasks_designs
    ]
    rows = [
        [
            job.name,
            ", ".join(job.modes) or "-",
            job.layout or "-",
            "yes" if job.asks_input else "no",
            job.plain_call or "-",
        ]
        for job in found.jobs.values()
    ]
    said = [  # by the server: shown as text, whatever it holds
        f"server    {named} at {found.server}",
        f"protocol  {found.protocol_version} ({negotiated})",
        f"tasks     {tasks}",
        f"designs   {', '.join(designs) or 'none'}",
        f"tools     {len(found.tools)}, {len(found.jobs)} of them jobs",
    ]
    return [
        *map(one_line, said),
        "",
        aligned(rows, ["job", "modes", "layout", "asks", "plain call"]) if rows else "No jobs.",
    ]


def manifest(args: argparse.Namespace) -> int:
    requirements = None
    if args.modes or args.job:
        requirements = Requirements(modes=args.modes or MODES, jobs=dict(args.job or ()))
    try:
        mode = "legacy" if args.handshake else "auto"  # legacy: an initialize handshake at 2025-11-25
        found = asyncio.run(read_manifest(connect(args.url, token=args.token, mode=mode)))
    except Exception as exc:
        if (cause := unreadable_cause(exc)) is None:
            raise
        print(f"handles: could not read the manifest of {args.url}: {cause}", file=sys.stderr)
        return UNREACHABLE
    print(found.model_dump_json(indent=2) if args.json else "\n".join(manifest_lines(found)))
    if requirements is None:
        return 0
    logging.getLogger("handles.client").setLevel(logging.WARNING)  # the fallbacks are printed below
    try:
        plan = found.check(requirements)
    except RequirementsNotMet as error:
        print("\n" + error.message, file=sys.stderr)
        return 1
    if not args.json:
        print(
            "\nmeets the requirements: " + ", ".join(f"{job} runs {mode}" for job, mode in plan.modes.items())
        )
        for note in plan.fallbacks.values():
            print(f"  {note}")
    return 0
