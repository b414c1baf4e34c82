"""Section 20: issue 14's rows in absolute time on this host, the code the issue was filed against beside this one.

Issue 14 set three of its targets in milliseconds: the start handler on an SQLite file (0.95 -> 0.25 ms) and on
PostgreSQL (3.1 -> 1.0 ms), and pickup on PostgreSQL (5.8 -> 2 ms), each measured by bench/ on main of
2026-11-30 on that session's host. A host that runs the same code slower or faster moves those figures with
it (the same code's start handler has measured 0.95 and 1.74 ms on two hosts of that week), so an absolute
target read on another host mixes the host's speed with the package's.

This section measures both codes on this host, in alternation: the tree of `FILED_COMMIT` (main's last commit
of 2026-11-30, taken from this checkout's history with `git archive`) and this tree, each running its own
bench/ (`run.py --only durable --only pickup --no-peer`) in a fresh process with its own code first on
`sys.path`, in the same virtual environment. For each row it gives:

- the host against the filing: the filed code here / its figure in the issue;
- the head against the filed code, on this host and in the same round: the fraction the package's changes
  took the row to, against the fraction the target asks (target / the issue's figure);
- the head against the target as written, in milliseconds.

Not in `--quick`: it runs sections 2 and 3 twice per round (about three minutes a round).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import REPO_ROOT, Options, Table, log, ms, verdict
from bench.trees import tree_at

SECTION = "filed"
FILED_COMMIT = "9d9d03c37929319daacdc57af2b871c2aff932d9"
"""Main's last commit of 2026-11-30, the day issue 14 was filed with its figures."""


@dataclass(frozen=True)
class Row:
    """One of issue 14's rows in absolute time: where bench/ keeps its p50 (section 2 or 3's table), the
    figure the issue was filed with and its target, in milliseconds."""

    label: str
    table: str
    store: str
    key: str
    filed_ms: float
    target_ms: float
    head_key: str | None = None
    """This code's figure, where it is another row of its table than the filed code's (`key`)."""

    @property
    def asked(self) -> float:
        """The fraction of the filed figure the target asks for."""
        return self.target_ms / self.filed_ms


ROWS = (
    Row("start handler without MCP, SQLite file", "2.", "SQLite file", "handler", 0.95, 0.25),
    Row("start handler without MCP, PostgreSQL", "2.", "PostgreSQL", "handler", 3.1, 1.0),
    Row("pickup, PostgreSQL", "3.", "PostgreSQL", "pickup_call", 5.8, 2.0),
    Row(
        "pickup, PostgreSQL, this code's job before its start's reply (as the filed code ran it; bench-only)",
        "3.",
        "PostgreSQL",
        "pickup_call",
        5.8,
        2.0,
        head_key="pickup_job_first",
    ),
)


def p50_of(results: dict[str, Any], row: Row, key: str) -> float | None:
    """The p50 in milliseconds of `row`'s table's `key` in a `run.py --json` document, or None when the run
    has no such figure (a store it could not reach)."""
    for table in results["tables"]:
        if table["title"].startswith(row.table):
            figure = table.get("data", {}).get(row.store, {}).get(key)
            return None if figure is None else float(figure["p50_ms"])
    return None


async def bench_of(tree: Path, options: Options, out: Path) -> dict[str, Any]:
    """`tree`'s own bench/, sections 2 and 3, in a fresh process with `tree` first on `sys.path`."""
    command = [sys.executable, "bench/run.py", "--only", "durable", "--only", "pickup", "--no-peer"]
    command += ["--json", str(out), "--postgres-url", options.postgres_url]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    process = await asyncio.create_subprocess_exec(
        *command, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, stderr = await process.communicate()
    if process.returncode != 0:
        tail = "\n".join(stderr.decode(errors="replace").splitlines()[-20:])
        raise RuntimeError(f"bench/run.py in {tree} exited {process.returncode}:\n{tail}")
    results: dict[str, Any] = json.loads(out.read_text())
    return results


def _figures(values: list[float | None]) -> str:
    return ", ".join(ms(v) if v is not None else "n/a" for v in values)


def _ratios(values: list[float | None]) -> str:
    return ", ".join(f"{v:.2f}x" if v is not None else "n/a" for v in values)


def _fraction(head: float | None, filed: float | None) -> float | None:
    return None if head is None or filed is None else head / filed


async def run(options: Options) -> list[Table]:
    rounds = options.n(2, 1)
    table = options.table(
        SECTION,
        "20. Issue 14's rows in absolute time on this host: the code it was filed against, and this code",
        [
            "row",
            "the issue: filed / target ms (target / filed)",
            "the filed code here, p50 ms by round (here / filed)",
            "this code here, p50 ms by round",
            "this code / the filed code, by round",
            "holds as the fraction asked",
            "holds in ms",
        ],
    )
    with tempfile.TemporaryDirectory(prefix="filed-", dir=options.work_dir) as scratch:
        tree = Path(scratch) / "tree"
        tree.mkdir()
        missing = tree_at(FILED_COMMIT, tree)
        if missing is not None:
            table.rows.append(["n/a", missing, "", "", "", "n/a", "n/a"])
            return [table]
        measured: dict[str, list[dict[str, Any]]] = {"filed": [], "head": []}
        for index in range(rounds):
            for which, code in (("filed", tree), ("head", REPO_ROOT)):
                log(f"filed: round {index + 1} of {rounds}, {which} ({code})")
                out = Path(scratch) / f"{which}-{index}.json"
                measured[which].append(await bench_of(code, options, out))
    for row in ROWS:
        filed = [p50_of(results, row, row.key) for results in measured["filed"]]
        head = [p50_of(results, row, row.head_key or row.key) for results in measured["head"]]
        fractions = [_fraction(h, f) for h, f in zip(head, filed, strict=True)]
        known = [f for f in fractions if f is not None]
        held = [h for h in head if h is not None]
        table.data[row.label] = {
            "filed_ms": row.filed_ms,
            "target_ms": row.target_ms,
            "asked": row.asked,
            "filed_code_here_ms": filed,
            "head_here_ms": head,
            "head_over_filed_code": fractions,
        }
        table.rows.append(
            [
                row.label,
                f"{ms(row.filed_ms)} / {ms(row.target_ms)} ({row.asked:.2f}x)",
                f"{_figures(filed)} ({_ratios([_fraction(f, row.filed_ms) for f in filed])})",
                _figures(head),
                _ratios(fractions),
                verdict(all(f <= row.asked for f in known) if known else None),
                verdict(all(h <= row.target_ms for h in held) if held else None),
            ]
        )
    table.notes += [
        f"The filed code is commit {FILED_COMMIT[:7]} (main's last of 2026-11-30), from this checkout's history; "
        "each round runs its bench/ and then this tree's, sections 2 and 3 (`--only durable --only pickup "
        "--no-peer`), each in a fresh process with its own tree first on sys.path, in this virtual environment.",
        "'here / filed': how this host runs the filed code against the figure the issue was filed with (above "
        "1: a slower host than the filing's). 'This code / the filed code': what the package's changes took the "
        "row to on one host, in the same round; it holds as the fraction asked when it is at most target / "
        "filed. 'Holds in ms' reads this code's figure against the target as written.",
        "Each run's rows are p50s of its own section's samples (section 2: 1,000 starts; section 3: 300 "
        "pickups), with the sections' own loops: this code's section 2 also times the floor, its section 3 "
        "the least a pickup could take (not used here).",
        "The filed code began a started job before its start's reply; this code gives the reply its turns of "
        "the event loop first (change 26), and section 3's in-process client, on the same loop, takes its reply "
        "in them. The last row is this code's pickup in the same rounds with those turns off (section 3's "
        "bench-only row), the filed code's order.",
    ]
    return [table]
