"""The `handles` command line: its commands, their arguments and the function each runs."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import handles
from handles.check import add_check_command
from handles.cli.admin import CONSOLE_TOKEN_ENV, console, db_upgrade, keygen, worker
from handles.cli.capabilities import _modes, _required_job, manifest
from handles.cli.common import operator_name
from handles.cli.jobs import audit_export, jobs_cancel, jobs_list, jobs_purge, jobs_show, watch
from handles.cli.switches import jobs_pause, jobs_unpause, switches_show, tasks_off, tasks_on
from handles.states import Status


def _age(value: str) -> timedelta:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        return timedelta(seconds=float(value[:-1]) * units[value[-1]])
    except (KeyError, ValueError, IndexError):
        raise argparse.ArgumentTypeError(
            f"{value!r}: use a number and a unit, like 30s, 15m, 2h or 7d"
        ) from None


class _PrintVersion(argparse.Action):
    """`--version`: print `handles VERSION` and exit; the version is read only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.update(nargs=0, default=argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"{parser.prog} {handles.__version__}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="handles", description="Operate a handles deployment.")
    parser.add_argument(
        "--version", action=_PrintVersion, help="print the installed version of handles and exit"
    )
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
        "--handshake",
        action="store_true",
        help="connect with an initialize handshake at 2025-11-25, as VS Code and other clients of the "
        "experimental tasks design do, and show what they get",
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
    add_check_command(commands)
    return parser
