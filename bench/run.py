"""The benchmark suite of `handles`: one command runs every section and prints markdown tables.

    python bench/run.py                       # the full suite (several minutes)
    python bench/run.py --quick               # a smoke run, well under two minutes
    python bench/run.py --only overhead       # one section (repeatable: --only pickup --only peer)
    python bench/run.py --json out.json       # also write every figure as JSON
    python bench/run.py --quick --no-peer     # skip the FastMCP peer (no venv to create)

A full run (no --quick, --only or --no-peer) keeps its headline figures in bench/results/headline.json and
redraws docs/img/performance-*.svg from them (bench/charts.py).

Sections: overhead (1), durable (2), pickup (3), store_scale (4), concurrency (5), peer (6),
multinode (7), profile (hot paths of work_progress and work_start), push (13: the requests pushed task
status saves for N followers of long jobs), result_links (a large result stored in parts and read
back through its link), console_page (the operator console's jobs page at up to 10^6 stored jobs), steps_poll (14: a progress
poll by what the job's steps returned), steps (15: what a durable step costs), start_parts (16: the start
handler by parts), start_drift (17: a start by how many its principal made before it), group_commit (18: what
one transaction for several starts would save each, the driver alone), poll_parts (19: a progress poll over
stdio by parts, each a tool of its own), filed (20: the start and pickup rows in absolute time, the code the targets were
set against and this code on one host, in alternation; about seven minutes), handle_timing (refusing a forged
handle vs another principal's genuine one; about 30 s), lease_load (what renewing the leases of 1,000 running
jobs costs PostgreSQL at each lease and heartbeat setting; about two minutes), notify_lock (21: commits/s of
concurrent writers with and without change notices, the wake across nodes, and PostgreSQL's notification lock
under two nodes' starts; about a minute). The last four are not part of --quick unless named with --only. Absolute times on a shared machine are noisy: read the ratios, measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import DEFAULT_POSTGRES_URL, Options, Table, environment, environment_markdown, log

SECTIONS = (
    "overhead",
    "durable",
    "pickup",
    "store_scale",
    "concurrency",
    "peer",
    "multinode",
    "profile",
    "handle_timing",
    "round_trips",
    "waiters",
    "tool_list_size",
    "push",
    "result_links",
    "console_page",
    "steps_poll",
    "steps",
    "start_parts",
    "start_drift",
    "group_commit",
    "poll_parts",
    "filed",
    "lease_load",
    "notify_lock",
)
NOT_QUICK = ("handle_timing", "filed", "lease_load", "notify_lock")
"""Sections a `--quick` run leaves out unless named with `--only` (each takes more than 20 s)."""


def _module(name: str):  # type: ignore[no-untyped-def]
    import importlib

    return importlib.import_module(f"bench.{name}")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python bench/run.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="small sample counts; finishes in under two minutes"
    )
    parser.add_argument(
        "--only", action="append", choices=SECTIONS, help="run only this section (repeatable)"
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON to this file")
    parser.add_argument("--markdown", type=Path, help="also write the printed markdown to this file")
    parser.add_argument(
        "--no-peer", action="store_true", help="skip section 6 (the FastMCP peer and its virtual environment)"
    )
    parser.add_argument(
        "--postgres-url",
        default=None,
        help=f"PostgreSQL for the store sections (default: HANDLES_BENCH_POSTGRES_URL or {DEFAULT_POSTGRES_URL})",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the scratch directory (databases, server logs)"
    )
    return parser.parse_args(argv)


def full_run(args: argparse.Namespace) -> bool:
    """Whether this run is the full suite with the peer, whose figures the performance page's charts draw."""
    return not (args.quick or args.only or args.no_peer)


def _redraw_charts(results: dict[str, object]) -> None:
    from bench import charts

    try:
        written = charts.record_run(results)
    except charts.MissingFigures as exc:
        log(f"charts not redrawn: {exc}")
        return
    log(
        f"figures kept in {charts.HEADLINE.relative_to(charts.REPO_ROOT)}; charts redrawn: "
        + ", ".join(str(path.relative_to(charts.REPO_ROOT)) for path in written)
    )


async def main_async(args: argparse.Namespace, command: str) -> int:
    import os

    work_dir = Path(tempfile.mkdtemp(prefix="handles-bench-"))
    options = Options(
        quick=args.quick,
        peer=not args.no_peer,
        postgres_url=args.postgres_url
        or os.environ.get("HANDLES_BENCH_POSTGRES_URL")
        or DEFAULT_POSTGRES_URL,
        work_dir=work_dir,
        command=command,
    )
    sections = args.only or [
        s for s in SECTIONS if (s != "peer" or options.peer) and not (options.quick and s in NOT_QUICK)
    ]
    started = time.perf_counter()
    info = environment(options)
    out: list[str] = ["# handles benchmark results", "", environment_markdown(info)]
    print("\n".join(out), flush=True)
    tables: list[Table] = []
    failures: list[str] = []
    for section in sections:
        log(f"section {section}")
        section_started = time.perf_counter()
        try:
            produced: list[Table] = await _module(section).run(options)
        except Exception:
            failures.append(section)
            detail = traceback.format_exc()
            log(f"section {section} failed:\n{detail}")
            produced = [
                options.table(
                    section,
                    f"{section}: FAILED",
                    ["error"],
                    rows=[[detail.strip().splitlines()[-1]]],
                )
            ]
        for table in produced:
            text = table.markdown()
            print(text, flush=True)
            out.append(text)
        tables.extend(produced)
        log(f"section {section} took {time.perf_counter() - section_started:.1f} s")
        logging.getLogger().setLevel(logging.WARNING)
    footer = [
        f"Total wall time: {time.perf_counter() - started:.0f} s; load average (1/5/15 min) at the end: "
        + " / ".join(f"{x:.2f}" for x in os.getloadavg())
        + ".",
    ]
    print("\n".join(footer), flush=True)
    out.append("\n".join(footer) + "\n")
    if args.markdown:
        args.markdown.write_text("\n".join(out))
    results = json.loads(
        json.dumps({"environment": info, "tables": [t.as_dict() for t in tables]}, default=str)
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if full_run(args) and not failures:
        _redraw_charts(results)
    if args.keep:
        log(f"scratch directory kept: {work_dir}")
    else:
        shutil.rmtree(work_dir, ignore_errors=True)
    if failures:
        log(f"sections that failed: {', '.join(failures)}")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    for noisy in ("httpx", "httpx2", "httpcore", "alembic", "mcp", "sqlalchemy", "docket", "fastmcp"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    shown_args = sys.argv[1:] if argv is None else argv
    command = "python bench/run.py" + ("" if not shown_args else " " + shlex.join(shown_args))
    return asyncio.run(main_async(args, command))


if __name__ == "__main__":
    sys.exit(main())
