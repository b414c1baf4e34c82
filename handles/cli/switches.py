"""`handles switches`, `handles tasks off|on` and `handles jobs pause|unpause`: the operator's switches."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from handles.check.report import aligned
from handles.cli.common import _clip, _when, open_repository, operator_name
from handles.config import HandlesConfig
from handles.errors import ConfigurationError
from handles.store import JobRepository, SwitchRecord
from handles.switches import PAUSED_PREFIX, TASKS, paused_switch


def _switch_row(row: SwitchRecord) -> dict[str, Any]:
    return {
        "switch": row.name,
        "job": row.name.removeprefix(PAUSED_PREFIX) if row.name.startswith(PAUSED_PREFIX) else None,
        "engaged": row.engaged,
        "reason": row.reason,
        "retry_after_seconds": row.retry_after_seconds,
        "changed_by": row.changed_by,
        "changed_at": row.changed_at.isoformat(),
    }


def switches_show(args: argparse.Namespace) -> int:
    rows = sorted(open_repository().switches(), key=lambda row: (row.name != TASKS, row.name))
    if args.json:
        print(json.dumps([_switch_row(row) for row in rows], indent=2))
        return 0
    if not rows:
        print("No switch was ever set: the Tasks face creates tasks, and no job kind is paused.")
        return 0
    table = [
        [
            "tasks (kill switch)" if row.name == TASKS else row.name,
            "ON" if row.engaged else "off",
            _clip(row.changed_by, 30),
            _when(row.changed_at),
            "-" if row.retry_after_seconds is None else f"{row.retry_after_seconds:g}s",
            _clip(row.reason or "-", 50),
        ]
        for row in rows
    ]
    headers = ["SWITCH", "STATE", "CHANGED BY", "CHANGED AT (UTC)", "RETRY AFTER", "REASON"]
    print(aligned(table, headers))
    return 0


def _set_switch(
    repository: JobRepository,
    args: argparse.Namespace,
    name: str,
    what: str,
    state: str,
    *,
    engaged: bool,
    retry: float | None = None,
) -> str:
    """Set switch `name` as `--by` (default: the OS user); then say `what` it now does, who set it and when,
    whether it was already so (`state` names the engaged state: "on", "paused"), and when nodes apply it."""
    by = args.by.strip() if args.by is not None else operator_name()
    if not by:
        raise ConfigurationError("--by must name who changes the switch (it is recorded).")
    row, before = repository.set_switch(
        name, engaged=engaged, by=by, reason=getattr(args, "reason", None), retry_after_seconds=retry
    )
    already = before is not None and before.engaged
    if row.engaged:
        was = f" (it was already {state}; now recorded as yours)" if already else ""
    else:
        was = "" if already else f" (it was not {state})"
    seconds = HandlesConfig.from_env().switch_cache_seconds
    return (
        f"{what}, by {row.changed_by} at {_when(row.changed_at)} UTC{was}: every node applies it within "
        f"{seconds:g} s (HANDLES_SWITCH_CACHE_SECONDS), without a restart"
    )


def tasks_off(args: argparse.Namespace) -> int:
    changed = _set_switch(open_repository(), args, TASKS, "Tasks kill switch ON", "on", engaged=True)
    print(
        f"{changed}. "
        "Calls that declare the Tasks extension now get the result inline or a handle, as other callers do; "
        "tasks already created are still served by tasks/get, tasks/update and tasks/cancel. "
        "Undo with `handles tasks on`."
    )
    return 0


def tasks_on(args: argparse.Namespace) -> int:
    changed = _set_switch(open_repository(), args, TASKS, "Tasks kill switch off", "on", engaged=False)
    print(f"{changed}; calls that declare the Tasks extension become tasks again.")
    return 0


def jobs_pause(args: argparse.Namespace) -> int:
    retry = args.retry_after.total_seconds()
    repository = open_repository()
    what = f"New {args.job} jobs PAUSED"
    changed = _set_switch(
        repository, args, paused_switch(args.job), what, "paused", engaged=True, retry=retry
    )
    print(
        f"{changed}. "
        f"Starts are refused with the retryable `paused` error, telling callers to retry in about {retry:g} s; "
        f"{args.job} jobs already started go on. Undo with `handles jobs unpause {args.job}`."
    )
    if not repository.list_jobs(kind=args.job, limit=1):
        print(
            f"handles: note: no {args.job} job is stored in this database; check the name (a job's name is the "
            "name of its function, as in its <job>_start tool).",
            file=sys.stderr,
        )
    return 0


def jobs_unpause(args: argparse.Namespace) -> int:
    what = f"New {args.job} jobs allowed again"
    print(f"{_set_switch(open_repository(), args, paused_switch(args.job), what, 'paused', engaged=False)}.")
    return 0
