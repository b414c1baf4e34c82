"""The `handles` command for operators: see and steer every stored job from a terminal.

- `handles jobs list|show|cancel|purge`: stored jobs, read from the configured database;
- `handles jobs pause|unpause JOB`: refuse (retryably) or allow again new starts of a job kind;
- `handles tasks off|on`: the Tasks face's kill switch (no new tasks; existing ones still served);
- `handles switches`: those switches, with who changed each last and when;
- `handles watch HANDLE|ID`: a live progress bar until the job ends;
- `handles keygen`: a new signing key (prepend it to HANDLES_SECRET_KEYS to rotate);
- `handles db upgrade`: apply the schema migrations to HANDLES_DATABASE_URL;
- `handles worker --app module:attribute`: run jobs without serving MCP;
- `handles manifest URL`: what a server offers a client (protocol, Tasks, jobs and their modes), and
  whether it meets a workflow's requirements (`--modes`, `--job`).
- `handles console --port N`: the operator web console (docs/console.md), behind HANDLES_CONSOLE_TOKEN.

It reads the same `HANDLES_*` environment as the servers (`handles manifest` only needs the URL).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import importlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from handles.config import MIN_KEY_LENGTH, HandlesConfig
from handles.errors import ConfigurationError
from handles.handle import HandleCodec
from handles.principal import principal_match, readable
from handles.sealing import shown as sensitive_shown
from handles.states import Status
from handles.store import InputRequestRecord, JobRecord, JobRepository, SwitchRecord, migrate
from handles.store.models import claims_of
from handles.store.reach import database_errors
from handles.switches import PAUSED_PREFIX, TASKS, Switches, paused_switch

if TYPE_CHECKING:
    from handles.app import Handles
    from handles.client.manifest import Manifest

# The MCP client (handles.client, handles.client.transient) is imported by the one command that speaks MCP,
# `manifest`: every other command starts without it, in half the time.

# -- the database ------------------------------------------------------------------------


def open_repository(url: str | None = None) -> JobRepository:
    """The configured job store, checked to be reachable and current; clear errors otherwise."""
    config = HandlesConfig.from_env()
    url = url or config.resolved_database_url()
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        raise ConfigurationError(
            f"There is no handles database at {url}. Set HANDLES_DATABASE_URL (or HANDLES_DATA_DIR) to the "
            "database your servers use."
        )
    with database_errors(url):
        repository = JobRepository(url)
        migrate.check_current(repository.engine)
    return repository


def find_job(repository: JobRepository, ident: str) -> JobRecord:
    """A job by id or by handle (any principal's: this is the operator's view)."""
    job_id = ident
    if "." in ident:
        claims = HandleCodec(HandlesConfig.from_env().resolved_secret_keys()).inspect(ident)
        if claims is None:
            raise ConfigurationError(
                "That handle was not signed by any key in HANDLES_SECRET_KEYS (or it is damaged). "
                "Pass the job id instead, or configure the key that signed it."
            )
        job_id = claims.job_id
    job = repository.get(job_id)
    if job is None:
        raise ConfigurationError(f"No job {job_id!r} in this database (it may have expired and been purged).")
    return job


def _age(value: str) -> timedelta:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        return timedelta(seconds=float(value[:-1]) * units[value[-1]])
    except (KeyError, ValueError, IndexError):
        raise argparse.ArgumentTypeError(
            f"{value!r}: use a number and a unit, like 30s, 15m, 2h or 7d"
        ) from None


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def _clip(text: str, width: int) -> str:
    """`text` within `width` characters, ending in `...` when cut (ASCII: any terminal encoding shows it)."""
    if len(text) <= width:
        return text
    return text[: width - 3] + "..." if width > 3 else text[:width]


def _progress(job: JobRecord) -> str:
    if job.progress_done is None:
        return "-"
    if job.progress_total:
        return f"{100 * job.progress_done / job.progress_total:.0f}%"
    return f"{job.progress_done:g}"


def job_summary(job: JobRecord) -> dict[str, Any]:
    return {
        "id": job.id,
        "job": job.kind,
        "status": job.status,
        "status_message": job.status_message,
        "principal": job.principal,
        "principal_readable": readable(job.principal),
        "progress": {"done": job.progress_done, "total": job.progress_total},
        "attempts": job.attempts,
        "created_at": job.created_at.isoformat(),
        "updated_at": job.updated_at.isoformat(),
        "expires_at": job.expires_at.isoformat(),
    }


def _table(rows: list[list[str]], headers: list[str]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


# -- commands ------------------------------------------------------------------------------


def jobs_list(args: argparse.Namespace) -> int:
    repository = open_repository()
    now = datetime.now(UTC)
    jobs = repository.list_jobs(
        statuses=args.status or (),
        kind=args.job,
        principal_matching=None if args.principal is None else principal_match(args.principal),
        created_before=now - args.older_than if args.older_than else None,
        created_after=now - args.newer_than if args.newer_than else None,
        limit=args.limit,
    )
    if args.json:
        print(json.dumps([job_summary(j) for j in jobs], indent=2))
        return 0
    engaged = Switches.of(repository.switches()).lines()
    for line in engaged:
        print(_one_line(f"Switch on: {line}"))
    if engaged:
        print()
    if not jobs:
        print("No jobs match.")
        return 0
    rows = [
        [
            j.id,
            j.kind,
            j.status,
            _progress(j),
            str(j.attempts),
            _clip(readable(j.principal), 40),
            _when(j.created_at),
            _when(j.updated_at),
        ]
        for j in jobs
    ]
    print(_table(rows, ["ID", "JOB", "STATUS", "PROGRESS", "ATTEMPTS", "PRINCIPAL", "CREATED", "UPDATED"]))
    return 0


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _question(request: InputRequestRecord, reveal: bool) -> dict[str, Any]:
    """A question the job asked; its answer only when revealed (answers are data, like results)."""
    shown: dict[str, Any] = {
        "key": request.key,
        "message": request.message,
        "asked_at": _iso(request.created_at),
        "answered": request.answered_at is not None,
        "answered_at": _iso(request.answered_at),
    }
    if reveal and request.answered_at is not None:
        shown["answer"] = sensitive_shown(request.answer)
    return shown


def _shown_lines(key: str, value: Any) -> list[str]:
    """A `jobs show` field as text: a run or a question per line, other lists and objects as JSON."""
    if key == "runs":
        return [
            f"attempt {r['attempt']} on {r['node']}, claimed {r['claimed_at']}"
            + (" (resumed)" if r["resumed"] else "")
            for r in value
        ]
    if key == "input_requests":
        return [
            f"{q['key']}: {json.dumps(q['message'], ensure_ascii=False)} asked {q['asked_at']}, "
            + (f"answered {q['answered_at']}" if q["answered"] else "not answered")
            + (f", answer {json.dumps(q['answer'], default=str)}" if "answer" in q else "")
            for q in value
        ]
    if isinstance(value, list | dict):
        return [json.dumps(value, default=str)]
    return [str(value)]


def jobs_show(args: argparse.Namespace) -> int:
    repository = open_repository()
    job = find_job(repository, args.job)
    details = job_summary(job)
    details.update(
        started_at=_iso(job.started_at),
        finished_at=_iso(job.finished_at),
        cancel_requested_at=_iso(job.cancel_requested_at),
        lease_owner=job.lease_owner,
        runs=[
            {
                "attempt": c.attempt,
                "node": c.node,
                "claimed_at": c.claimed_at.isoformat(),
                "resumed": c.resumed,
            }
            for c in claims_of(job)
        ],
        on_interrupt=job.on_interrupt,
        max_attempts=job.max_attempts,
        error=job.error,
        input_requests=[_question(r, args.reveal_results) for r in repository.questions(job.id)],
        steps=[
            {
                "name": s.name,
                "status": s.status,
                "attempt": s.attempt,
                "started_at": s.started_at.isoformat(),
                "finished_at": _iso(s.finished_at),
            }
            for s in repository.steps(job.id)
        ],
    )
    if args.reveal_results:
        details["arguments"] = sensitive_shown(job.arguments)
        details["result"] = job.result
    if args.json:
        print(json.dumps(details, indent=2, default=str))
        return 0
    for key, value in details.items():
        lines = _shown_lines(key, value)
        if key == "runs" and not value and job.attempts:
            lines = ["(not recorded: the job was claimed before schema revision 0005)"]
        for index, line in enumerate(lines or [""]):
            print(f"{key if index == 0 else '':>20}  {_one_line(line)}")
    if not args.reveal_results:
        print("\n(arguments, result and answers are hidden; pass --reveal-results to show them)")
    return 0


def jobs_cancel(args: argparse.Namespace) -> int:
    repository = open_repository()
    job = find_job(repository, args.job)
    outcome = repository.request_cancel(job.id, f"operator:{args.by}")
    assert outcome is not None
    repository.publish(job.id, "cli")
    if Status(job.status).is_terminal:
        print(f"{job.id} had already ended ({job.status}); nothing changed.")
    elif outcome.ended_now:
        print(f"{job.id} was queued and is now cancelled.")
    else:
        print(f"Cancellation requested for {job.id}; the node running it stops it at its next safe point.")
    return 0


def jobs_purge(args: argparse.Namespace) -> int:
    if not args.expired:
        raise ConfigurationError(
            "Say what to purge: `handles jobs purge --expired` deletes ended jobs past retention."
        )
    repository = open_repository()
    total = 0
    keep = HandlesConfig.from_env().audit_retention_seconds
    while deleted := repository.delete_expired(500, keep):
        total += deleted
    print(f"Purged {total} expired job{'s' if total != 1 else ''}.")
    return 0


def audit_export(args: argparse.Namespace) -> int:
    """Every archived evidence record (then, with --live, the evidence of jobs still stored) as JSON lines."""
    repository = open_repository()
    since = datetime.now(UTC) - args.since if args.since is not None else None
    after = 0
    while page := repository.archived_evidence(after_id=after, since=since, job_id=args.job):
        for record in page:
            print(
                json.dumps({"archived_at": _iso(record.archived_at), **record.evidence}, ensure_ascii=False)
            )
        after = page[-1].id or after
    if args.live:
        last = ""
        while live := repository.live_evidence(after_id=last, job_id=args.job):
            for evidence in live:
                print(json.dumps({"archived_at": None, **evidence}, ensure_ascii=False))
            last = live[-1]["job_id"]
    return 0


# -- the operator's switches -------------------------------------------------------------


def operator_name() -> str:
    """The default `--by`: the operating-system user running the command."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no user name in the environment and no passwd entry for the uid
        return f"uid {os.getuid()}"


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
    print(
        _one_line_table(table, ["SWITCH", "STATE", "CHANGED BY", "CHANGED AT (UTC)", "RETRY AFTER", "REASON"])
    )
    return 0


def _one_line_table(rows: list[list[str]], headers: list[str]) -> str:
    return _table([[_one_line(cell) for cell in row] for row in rows], headers)


def _set_switch(
    repository: JobRepository,
    args: argparse.Namespace,
    name: str,
    *,
    engaged: bool,
    retry: float | None = None,
) -> tuple[SwitchRecord, SwitchRecord | None]:
    """Set switch `name` as `--by` (default: the OS user); (as now set, as it was)."""
    by = args.by.strip() if args.by is not None else operator_name()
    if not by:
        raise ConfigurationError("--by must name who changes the switch (it is recorded).")
    return repository.set_switch(
        name, engaged=engaged, by=by, reason=getattr(args, "reason", None), retry_after_seconds=retry
    )


def _takes_effect() -> str:
    seconds = HandlesConfig.from_env().switch_cache_seconds
    return f"every node applies it within {seconds:g} s (HANDLES_SWITCH_CACHE_SECONDS), without a restart"


def tasks_off(args: argparse.Namespace) -> int:
    row, before = _set_switch(open_repository(), args, TASKS, engaged=True)
    was = " (it was already on; now recorded as yours)" if before is not None and before.engaged else ""
    print(
        f"Tasks kill switch ON, by {row.changed_by} at {_when(row.changed_at)} UTC{was}: {_takes_effect()}. "
        "Calls that declare the Tasks extension now get the result inline or a handle, as other callers do; "
        "tasks already created are still served by tasks/get, tasks/update and tasks/cancel. "
        "Undo with `handles tasks on`."
    )
    return 0


def tasks_on(args: argparse.Namespace) -> int:
    row, before = _set_switch(open_repository(), args, TASKS, engaged=False)
    was = "" if before is not None and before.engaged else " (it was not on)"
    print(
        f"Tasks kill switch off, by {row.changed_by} at {_when(row.changed_at)} UTC{was}: {_takes_effect()}; "
        "calls that declare the Tasks extension become tasks again."
    )
    return 0


def jobs_pause(args: argparse.Namespace) -> int:
    retry = args.retry_after.total_seconds()
    repository = open_repository()
    row, before = _set_switch(repository, args, paused_switch(args.job), engaged=True, retry=retry)
    was = " (it was already paused; now recorded as yours)" if before is not None and before.engaged else ""
    print(
        f"New {args.job} jobs PAUSED, by {row.changed_by} at {_when(row.changed_at)} UTC{was}: {_takes_effect()}. "
        f"Starts are refused with the retryable `paused` error, telling callers to retry in about {retry:g} s; "
        f"{args.job} jobs already started go on. Undo with `handles jobs unpause {args.job}`."
    )
    _warn_if_unknown(repository, args.job)
    return 0


def jobs_unpause(args: argparse.Namespace) -> int:
    row, before = _set_switch(open_repository(), args, paused_switch(args.job), engaged=False)
    was = "" if before is not None and before.engaged else " (it was not paused)"
    print(
        f"New {args.job} jobs allowed again, by {row.changed_by} at {_when(row.changed_at)} UTC{was}: "
        f"{_takes_effect()}."
    )
    return 0


def _warn_if_unknown(repository: JobRepository, job: str) -> None:
    if not repository.list_jobs(kind=job, limit=1):
        print(
            f"handles: note: no {job} job is stored in this database; check the name (a job's name is the name "
            "of its function, as in its <job>_start tool).",
            file=sys.stderr,
        )


def _one_line(text: str) -> str:
    """`text` on one line with nothing a terminal would interpret (newlines, escapes) left in it."""
    return "".join(c if c.isprintable() else " " for c in text)


def watch_line(job: JobRecord, columns: int | None = None) -> str:
    """One line of `handles watch`: the job's bar, percentage, status and status message.

    Within `columns`, the bar narrows (to nothing at worst) and the message is cut, so the percentage
    and the status stay in view.
    """
    fraction = (job.progress_done or 0) / job.progress_total if job.progress_total else None
    shown = f"{fraction * 100:5.1f}%" if fraction is not None else "   ..."
    status = _one_line(f"{shown} {job.status}: {job.status_message or ''}")
    name = _one_line(job.kind)
    # Room for the status and a cut message's "..." comes first; the bar takes what is left.
    bar_width = (
        30 if columns is None else max(0, min(30, columns - len(f"{name} [] {shown} {job.status}...")))
    )
    bar = "#" * int(bar_width * min(fraction, 1.0)) if fraction is not None else ""
    line = f"{name} [{bar.ljust(bar_width)}] {status}"
    return line if columns is None else _clip(line, columns)


def watch(args: argparse.Namespace) -> int:
    """Redraw one line in place on a terminal (cut to its width); otherwise a plain line per change."""
    repository = open_repository()
    job = find_job(repository, args.job)
    terminal = sys.stdout.isatty()
    drawn: str | None = None
    while True:
        # On a terminal, leave the last column free: writing into it wraps on some terminals.
        line = watch_line(job, max(shutil.get_terminal_size().columns - 1, 1) if terminal else None)
        if line != drawn:
            sys.stdout.write(f"\r\x1b[2K{line}" if terminal else f"{line}\n")
            sys.stdout.flush()
            drawn = line
        if Status(job.status).is_terminal:
            if terminal:
                sys.stdout.write("\n")
            return 0 if job.status == Status.COMPLETED else 1
        time.sleep(args.interval)
        latest = repository.get(job.id)
        if latest is None:
            sys.stdout.write(("\n" if terminal else "") + "The job was deleted while watching.\n")
            return 1
        job = latest


def keygen(_args: argparse.Namespace) -> int:
    key = secrets.token_urlsafe(48)
    assert len(key) >= MIN_KEY_LENGTH
    print(key)
    return 0


def db_upgrade(args: argparse.Namespace) -> int:
    config = HandlesConfig.from_env()
    url = args.database_url or config.resolved_database_url()
    with database_errors(url):
        repository = JobRepository(url)
        try:
            before = migrate.current_revision(repository.engine)
            migrate.upgrade(repository.engine)
            after = migrate.current_revision(repository.engine)
        finally:
            repository.dispose()
    print(
        f"handles schema: {before or 'empty'} -> {after}"
        if before != after
        else f"handles schema: {after} (current)"
    )
    return 0


def load_app(spec: str) -> Handles:
    """`module:attribute`, where the attribute is a `Handles` or a function returning one."""
    from handles.app import Handles

    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"--app {spec!r}: use the form module:attribute, e.g. myservice.jobs:jobs")
    sys.path.insert(0, os.getcwd())
    try:
        target: Any = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"--app {spec!r}: cannot load it ({exc})") from exc
    app = target() if callable(target) and not isinstance(target, Handles) else target
    if not isinstance(app, Handles):
        raise ConfigurationError(f"--app {spec!r} is a {type(app).__name__}, not a handles.Handles")
    return app


def worker(args: argparse.Namespace) -> int:
    app = load_app(args.app or os.environ.get("HANDLES_APP", ""))
    # A worker always runs jobs, whatever HANDLES_RUN_WORKERS says for the web nodes.
    app.reconfigure(run_workers=True)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(signum, stop.set)
        async with app.running():
            logging.getLogger("handles").info(
                "worker %s running jobs %s", app.runtime.owner, ", ".join(sorted(app.specs))
            )
            await stop.wait()

    asyncio.run(run())
    return 0


def _listed(value: str, allowed: tuple[str, ...], what: str) -> list[str]:
    items = [item for item in value.split(",") if item]
    unknown = [item for item in items if item not in allowed]
    if unknown:
        raise argparse.ArgumentTypeError(f"{', '.join(unknown)}: not {what}; use {', '.join(allowed)}")
    return items


def _modes(value: str) -> list[str]:
    from handles.client.manifest import MODES

    return _listed(value, MODES, "a mode")


def _required_job(value: str) -> tuple[str, list[str]]:
    from handles.client.manifest import VERBS

    name, _, verbs = value.partition(":")
    return name, _listed(verbs, VERBS, "a verb")


def manifest_lines(found: Manifest) -> list[str]:
    """`handles manifest` for people: the server, the protocol, the Tasks extension, then a row per job."""
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
    return [
        f"server    {named} at {found.server}",
        f"protocol  {found.protocol_version} ({negotiated})",
        f"tasks     {tasks}",
        f"tools     {len(found.tools)}, {len(found.jobs)} of them jobs",
        "",
        _table(rows, ["job", "modes", "layout", "asks", "plain call"]) if rows else "No jobs.",
    ]


def manifest(args: argparse.Namespace) -> int:
    from handles.client.follow import connect
    from handles.client.manifest import MODES, Requirements, RequirementsNotMet, read_manifest
    from handles.client.transient import authentication_error, is_connection_failure, leaves

    requirements = None
    if args.modes or args.job:
        requirements = Requirements(modes=args.modes or MODES, jobs=dict(args.job or ()))
    try:
        found = asyncio.run(read_manifest(connect(args.url, token=args.token)))
    except Exception as exc:
        refused = authentication_error(exc)
        if refused is None and not is_connection_failure(exc):
            raise
        cause = refused if refused is not None else leaves(exc)[0]
        print(f"handles: could not read the manifest of {args.url}: {cause}", file=sys.stderr)
        return 3
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


CONSOLE_TOKEN_ENV = "HANDLES_CONSOLE_TOKEN"


def console(args: argparse.Namespace) -> int:
    """Serve the operator console alone, on the configured database; never without a token."""
    import uvicorn

    from handles.console import console_app

    token = os.environ.get(CONSOLE_TOKEN_ENV, "")
    if len(token) < 16:
        raise ConfigurationError(
            f"Set {CONSOLE_TOKEN_ENV} to a secret of at least 16 characters (`handles keygen` makes one): "
            "the console shows and steers every job, so it never starts open."
        )
    url = args.database_url or HandlesConfig.from_env().resolved_database_url()
    open_repository(url).dispose()  # reachable and current, or a clear error now
    app = console_app(url, token=token)
    logging.getLogger("handles").info("operator console on http://%s:%d/", args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="handles", description="Operate a handles deployment.")
    commands = parser.add_subparsers(dest="command", required=True)

    jobs = commands.add_parser("jobs", help="see and steer stored jobs").add_subparsers(
        dest="jobs_command", required=True
    )
    listing = jobs.add_parser("list", help="list jobs, newest first")
    listing.add_argument("--status", action="append", choices=[s.value for s in Status], help="repeatable")
    listing.add_argument("--job", help="only jobs of this kind (the job's name)")
    listing.add_argument(
        "--principal",
        metavar="P",
        help="only jobs whose stored principal is P, or of local principal P, or of a token whose subject or "
        "client id is P (exact, case-sensitive)",
    )
    listing.add_argument(
        "--older-than", type=_age, metavar="AGE", help="created more than AGE ago (30s, 15m, 2h, 7d)"
    )
    listing.add_argument("--newer-than", type=_age, metavar="AGE", help="created less than AGE ago")
    listing.add_argument("--limit", type=int, default=50)
    listing.add_argument("--json", action="store_true", help="JSON for scripts")
    listing.set_defaults(run=jobs_list)
    show = jobs.add_parser("show", help="one job: status, progress, attempts, steps, timestamps")
    show.add_argument("job", metavar="ID|HANDLE")
    show.add_argument("--json", action="store_true")
    show.add_argument(
        "--reveal-results",
        action="store_true",
        help="also print the job's arguments and result (operator only)",
    )
    show.set_defaults(run=jobs_show)
    cancel = jobs.add_parser("cancel", help="request cancellation of a job")
    cancel.add_argument("job", metavar="ID|HANDLE")
    cancel.add_argument(
        "--by",
        default=operator_name(),
        help="who asks, recorded on the job as operator:BY (default: your user name)",
    )
    cancel.set_defaults(run=jobs_cancel)
    purge = jobs.add_parser("purge", help="delete ended jobs past their retention now")
    purge.add_argument("--expired", action="store_true", help="required: purge jobs past retention")
    purge.set_defaults(run=jobs_purge)
    pause = jobs.add_parser(
        "pause",
        help="refuse new starts of a job kind on every node (running jobs go on)",
        description="Pause new starts of JOB on every node, within HANDLES_SWITCH_CACHE_SECONDS and without a "
        "restart: its start tool, its plain tool and its tasks answer the retryable `paused` error, telling "
        "the caller to retry after --retry-after. Jobs already started (running, queued, waiting for an "
        "answer) are not touched.",
    )
    pause.add_argument("job", metavar="JOB", help="the job's name (its function's name)")
    pause.add_argument(
        "--retry-after",
        type=_age,
        default=timedelta(seconds=60),
        metavar="AGE",
        help="how long refused callers are told to wait before retrying (default 60s)",
    )
    pause.add_argument("--reason", help="why, for other operators (never shown to callers)")
    pause.add_argument("--by", help="who pauses it, as recorded (default: the operating-system user)")
    pause.set_defaults(run=jobs_pause)
    unpause = jobs.add_parser("unpause", help="allow new starts of a paused job kind again")
    unpause.add_argument("job", metavar="JOB")
    unpause.add_argument("--by", help="who unpauses it, as recorded (default: the operating-system user)")
    unpause.set_defaults(run=jobs_unpause)

    tasks = commands.add_parser(
        "tasks", help="the Tasks face's kill switch (no new tasks; existing tasks still served)"
    ).add_subparsers(dest="tasks_command", required=True)
    off = tasks.add_parser(
        "off",
        help="stop creating tasks on every node",
        description="Turn the Tasks face's kill switch on (rollback mode) on every node, within "
        "HANDLES_SWITCH_CACHE_SECONDS and without a restart: a tools/call that declares the Tasks extension "
        "is answered as one that does not (the result inline, or the job's handle for the handle tools), "
        "while tasks/get, tasks/update and tasks/cancel keep serving every task already created.",
    )
    off.add_argument("--reason", help="why, for other operators (never shown to callers)")
    off.add_argument("--by", help="who turns it on, as recorded (default: the operating-system user)")
    off.set_defaults(run=tasks_off)
    on = tasks.add_parser("on", help="create tasks again (turn the kill switch off)")
    on.add_argument("--by", help="who turns it off, as recorded (default: the operating-system user)")
    on.set_defaults(run=tasks_on)

    switches = commands.add_parser(
        "switches", help="the operator's switches: who changed each last, and when"
    )
    switches.add_argument("--json", action="store_true", help="JSON for scripts")
    switches.set_defaults(run=switches_show)

    audit = commands.add_parser("audit", help="the evidence kept after jobs are deleted").add_subparsers(
        dest="audit_command", required=True
    )
    export = audit.add_parser(
        "export",
        help="print evidence records as JSON lines",
        description="Print the evidence archived when jobs were deleted (who started, answered and cancelled "
        "them, their steps with receipts, their outcome; never arguments, answers or results), oldest first, "
        "one JSON object per line. Kept for HANDLES_AUDIT_RETENTION_SECONDS.",
    )
    export.add_argument(
        "--since", type=_age, metavar="AGE", help="archived less than AGE ago (30s, 15m, 2h, 7d)"
    )
    export.add_argument("--job", metavar="ID", help="only this job's evidence")
    export.add_argument("--live", action="store_true", help="also the evidence of jobs still stored")
    export.set_defaults(run=audit_export)

    follow = commands.add_parser("watch", help="a live progress bar until the job ends")
    follow.add_argument("job", metavar="HANDLE|ID")
    follow.add_argument("--interval", type=float, default=0.5, help="seconds between reads (default 0.5)")
    follow.set_defaults(run=watch)

    generate = commands.add_parser(
        "keygen",
        help="print a new secret key for signing handles",
        description="Print a new random signing key (64 URL-safe characters). Put it first in "
        "HANDLES_SECRET_KEYS to rotate; keep the old key after it until its handles have expired.",
    )
    generate.set_defaults(run=keygen)

    database = commands.add_parser("db", help="database schema").add_subparsers(
        dest="db_command", required=True
    )
    upgrade = database.add_parser(
        "upgrade",
        help="apply schema migrations",
        description="Bring the handles tables in HANDLES_DATABASE_URL (or --database-url) to the newest "
        "schema revision. Safe to run on a live database and from several places at once.",
    )
    upgrade.add_argument("--database-url", help="SQLAlchemy URL (default: HANDLES_DATABASE_URL)")
    upgrade.set_defaults(run=db_upgrade)

    work = commands.add_parser(
        "worker",
        help="run jobs without serving MCP",
        description="Run the jobs of an application against the configured database, without serving "
        "MCP: the job tier of a deployment whose web nodes set HANDLES_RUN_WORKERS=0.",
    )
    work.add_argument("--app", help="module:attribute of your Handles instance (default: HANDLES_APP)")
    work.set_defaults(run=worker)

    show_manifest = commands.add_parser(
        "manifest",
        help="what a server offers a client, and whether it meets a workflow's requirements",
        description="Read a server's capability manifest over Streamable HTTP, as handles.client sees it "
        "(a client that declares the Tasks extension): the protocol version, the server's name and version, "
        "the Tasks extension, and each job with its tools and modes. With --modes or --job, check a "
        "workflow's requirements: exit 1 and list every unmet one. Exit 3 when the server cannot be read.",
    )
    show_manifest.add_argument("url", help="the server's MCP endpoint, e.g. http://127.0.0.1:8000/mcp")
    show_manifest.add_argument("--token", help="a bearer token to send")
    show_manifest.add_argument(
        "--json", action="store_true", help="the manifest as JSON, for logs and scripts"
    )
    show_manifest.add_argument(
        "--modes",
        type=_modes,
        metavar="M[,M...]",
        help="the modes the workflow accepts, most wanted first: tasks, handles, inline (default: any)",
    )
    show_manifest.add_argument(
        "--job",
        action="append",
        type=_required_job,
        metavar="NAME[:VERB,...]",
        help="a job the workflow needs, with what it must do besides running (e.g. deploy_release:respond); "
        "repeatable",
    )
    show_manifest.set_defaults(run=manifest)

    serve = commands.add_parser(
        "console",
        help="serve the operator web console",
        description="Serve the operator web console (see and steer every job from a browser) on the "
        f"configured database. It requires {CONSOLE_TOKEN_ENV} (at least 16 characters) and refuses to "
        "start without it; operators sign in with that token.",
    )
    serve.add_argument("--port", type=int, default=8700)
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    serve.add_argument("--database-url", help="SQLAlchemy URL (default: HANDLES_DATABASE_URL)")
    serve.set_defaults(run=console)
    return parser


_DASHED_ID = re.compile(r"^-[A-Za-z0-9_-]{16,64}$")
"""A job id that begins with `-` (ids stored before they were drawn without one): never an option here."""


def accept_dashed_ids(argv: list[str]) -> list[str]:
    """`argv` with a job id that begins with `-` passed as the value it is, not read as an option.

    No option of this CLI looks like one (they are `-h` and `--long` names), and every command that takes
    an id takes it as its one positional argument or as the value of `--job`: the id goes after `--`
    at the end, or joins its option as `--job=ID`.
    """
    if "--" in argv:
        return argv
    dashed = [index for index, token in enumerate(argv) if _DASHED_ID.match(token)]
    if len(dashed) != 1:
        return argv
    index = dashed[0]
    if index > 0 and argv[index - 1] == "--job":
        return [*argv[: index - 1], f"{argv[index - 1]}={argv[index]}", *argv[index + 1 :]]
    return [*argv[:index], *argv[index + 1 :], "--", argv[index]]


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for chatty in ("alembic", "httpx2"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    args = build_parser().parse_args(accept_dashed_ids(sys.argv[1:] if argv is None else argv))
    try:
        code: int = args.run(args)
    except ConfigurationError as exc:
        print(f"handles: {exc}", file=sys.stderr)
        return 2
    return code
