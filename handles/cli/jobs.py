"""`handles jobs list|show|cancel|purge`, `handles audit export` and `handles watch`: the stored jobs."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from handles.check.report import aligned, one_line
from handles.cli.common import _clip, _when, find_job, open_repository
from handles.config import HandlesConfig
from handles.errors import ConfigurationError
from handles.liveness import LeaseTiming, node_contact
from handles.outcomes import OPERATOR_PREFIX, canceller
from handles.principal import principal_match, readable
from handles.sealing import shown as sensitive_shown
from handles.states import Status
from handles.store import InputRequestRecord, JobRecord
from handles.store.audit import _iso
from handles.store.models import claims_of
from handles.switches import Switches


def _progress(job: JobRecord) -> str:
    if job.progress_done is None:
        return "-"
    if job.progress_total:
        return f"{100 * job.progress_done / job.progress_total:.0f}%"
    return f"{job.progress_done:g}"


def job_summary(
    job: JobRecord, *, now: datetime | None = None, timing: LeaseTiming | None = None
) -> dict[str, Any]:
    """A job as `jobs list --json` shows it, with `node_contact` while a node runs it."""
    contact = node_contact(
        job.status,
        job.lease_expires_at,
        now or datetime.now(UTC),
        timing or LeaseTiming.of(HandlesConfig.from_env()),
    )
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
        "node_contact": None if contact is None else contact.as_dict(),
    }


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
    timing = LeaseTiming.of(HandlesConfig.from_env())
    summaries = [job_summary(j, now=now, timing=timing) for j in jobs]
    if args.json:
        print(json.dumps(summaries, indent=2))
        return 0
    engaged = Switches.of(repository.switches()).lines()
    for line in engaged:
        print(one_line(f"Switch on: {line}"))
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
            (s["node_contact"] or {}).get("summary", "-"),
        ]
        for j, s in zip(jobs, summaries, strict=True)
    ]
    headers = ["ID", "JOB", "STATUS", "PROGRESS", "ATTEMPTS", "PRINCIPAL", "CREATED", "UPDATED", "NODE"]
    print(aligned(rows, headers))
    return 0


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
    if key == "cancel_requested_by" and value is not None:
        return [f"{value['role']} {value['name']}"]
    if key == "node_contact" and value is not None:
        return [
            value["summary"],
            f"last heard {value['last_heard_at']}",
            f"taken over by {value['takeover_by']} at the latest, unless heard from first",
        ]
    if isinstance(value, list | dict):
        return [json.dumps(value, default=str)]
    return [str(value)]


def jobs_show(args: argparse.Namespace) -> int:
    repository = open_repository()
    job = find_job(repository, args.job)
    details = job_summary(job)
    who = canceller(job.cancel_requested_by, job.principal)  # (role, name): caller, operator or server
    details.update(
        started_at=_iso(job.started_at),
        finished_at=_iso(job.finished_at),
        cancel_requested_at=_iso(job.cancel_requested_at),
        cancel_requested_by=None if who is None else {"role": who[0], "name": who[1]},
        lease_owner=job.lease_owner,
        runs=[{**asdict(c), "claimed_at": c.claimed_at.isoformat()} for c in claims_of(job)],
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
            print(f"{key if index == 0 else '':>20}  {one_line(line)}")
    if not args.reveal_results:
        print("\n(arguments, result and answers are hidden; pass --reveal-results to show them)")
    return 0


def jobs_cancel(args: argparse.Namespace) -> int:
    repository = open_repository()
    job = find_job(repository, args.job)
    outcome = repository.request_cancel(job.id, OPERATOR_PREFIX + args.by)
    assert outcome is not None
    repository.load_notice_scope()  # its notice names its deployment's schema, as a node's do
    repository.publish(job.id, "cli")
    repository.dispose()  # sends the notice before the command exits
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


def watch_line(job: JobRecord, columns: int | None = None) -> str:
    """One line of `handles watch`: the job's bar, percentage, status and status message."""
    fraction = (job.progress_done or 0) / job.progress_total if job.progress_total else None
    shown = f"{fraction * 100:5.1f}%" if fraction is not None else "   ..."
    status = one_line(f"{shown} {job.status}: {job.status_message or ''}")
    name = one_line(job.kind)
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
