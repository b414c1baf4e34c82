"""Two commits' bench/ on this host, section by section in alternation, and their ratio rows side by side.

    python bench/ab.py 5e5b889                      # every section but peer, filed and lease_load; one round
    python bench/ab.py 5e5b889 --rounds 2 --only overhead --only pickup
    python bench/ab.py 5e5b889 --peer --json ab.json

The base commit's tree comes from this checkout's history (`git archive`); this checkout is the head. For
each round and section, the base runs its own `bench/run.py --only SECTION` and then the head runs its own,
each in a fresh process with its tree first on `sys.path`, so drift on a shared host falls on both alike.
Every cell written as a ratio (`1.23x`) in a table both runs print is compared: base, head, and the change.
Rows whose change is beyond `--tolerance` (10% by default) are marked.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import DEFAULT_POSTGRES_URL, REPO_ROOT, log
from bench.run import NOT_QUICK, SECTIONS
from bench.trees import tree_at

_NUMBER = re.compile(r"^[-+<>=~ ]*\d")
"""A cell that holds a figure: a row's label is the cells before its first figure."""

LEFT_OUT = ("peer", *NOT_QUICK)
"""Sections a plain A/B leaves out: the peer (its own venv, the same for both), and those that run long."""


async def section_of(tree: Path, section: str, out: Path, postgres_url: str) -> dict[str, Any]:
    """`tree`'s own bench/ for one section, in a fresh process with `tree` first on `sys.path`."""
    command = [sys.executable, "bench/run.py", "--only", section, "--json", str(out)]
    command += ["--postgres-url", postgres_url] + ([] if section == "peer" else ["--no-peer"])
    env = {**os.environ, "PYTHONPATH": str(tree)}
    process = await asyncio.create_subprocess_exec(
        *command, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, stderr = await process.communicate()
    if process.returncode != 0 or not out.exists():
        tail = "\n".join(stderr.decode(errors="replace").splitlines()[-5:])
        log(f"{section} in {tree} exited {process.returncode}:\n{tail}")
        return {"tables": []}
    results: dict[str, Any] = json.loads(out.read_text())
    return results


def ratio_cells(results: list[dict[str, Any]]) -> dict[tuple[str, str, str], list[float]]:
    """Every ratio cell of every run, keyed by (table title, row label, column), one value per run."""
    cells: dict[tuple[str, str, str], list[float]] = {}
    for run in results:
        for table in run["tables"]:
            for row in table["rows"]:
                labels = len(list(itertools.takewhile(lambda cell: not _NUMBER.match(str(cell)), row))) or 1
                label = " / ".join(str(cell) for cell in row[:labels])
                for column, cell in zip(table["columns"][labels:], row[labels:], strict=False):
                    text = str(cell).strip()
                    if not text.endswith("x"):
                        continue
                    try:
                        value = float(text[:-1])
                    except ValueError:
                        continue
                    cells.setdefault((table["title"], label, column), []).append(value)
    return cells


def compare(base: list[dict[str, Any]], head: list[dict[str, Any]], tolerance: float) -> list[str]:
    """A markdown table of the ratio cells both sides measured: the median of each side's rounds."""
    base_cells, head_cells = ratio_cells(base), ratio_cells(head)
    lines = ["| table | row | column | base | head | change |", "|---|---|---|---|---|---|"]
    beyond = 0
    for key in (k for k in base_cells if k in head_cells):
        b, h = statistics.median(base_cells[key]), statistics.median(head_cells[key])
        change = (h - b) / b if b else 0.0
        mark = " **beyond**" if abs(change) > tolerance else ""
        beyond += bool(mark)
        lines.append(
            f"| {key[0][:60]} | {key[1][:70]} | {key[2][:40]} | {b:.2f}x | {h:.2f}x | {change:+.1%}{mark} |"
        )
    lines.append("")
    lines.append(f"{len(lines) - 3} ratio cells compared; {beyond} changed by more than {tolerance:.0%}.")
    return lines


async def main_async(args: argparse.Namespace) -> int:
    if args.again:
        measured = json.loads(args.again.read_text())
        print("\n".join(compare(measured["base"], measured["head"], args.tolerance)))
        return 0
    sections = args.only or [s for s in SECTIONS if s not in LEFT_OUT or (s == "peer" and args.peer)]
    measured: dict[str, list[dict[str, Any]]] = {"base": [], "head": []}
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as scratch:
        base_tree = Path(scratch) / "base"
        base_tree.mkdir()
        missing = tree_at(args.base, base_tree)
        if missing is not None:
            log(missing)
            return 2
        for index in range(args.rounds):
            for section in sections:
                for which, tree in (("base", base_tree), ("head", REPO_ROOT)):
                    log(f"ab: round {index + 1} of {args.rounds}, {section}, {which}")
                    out = Path(scratch) / f"{which}-{section}-{index}.json"
                    measured[which].append(await section_of(tree, section, out, args.postgres_url))
    if args.json:
        args.json.write_text(json.dumps(measured, indent=1))
    print(f"# bench A/B: {args.base} (base) against this checkout (head), {args.rounds} round(s)\n")
    print("\n".join(compare(measured["base"], measured["head"], args.tolerance)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/ab.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("base", help="the commit to compare this checkout against")
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds of every section")
    parser.add_argument("--only", action="append", choices=SECTIONS, help="this section only (repeatable)")
    parser.add_argument("--peer", action="store_true", help="include the FastMCP peer section")
    parser.add_argument("--tolerance", type=float, default=0.10, help="mark changes beyond this fraction")
    parser.add_argument("--json", type=Path, help="also write both sides' results as JSON to this file")
    parser.add_argument("--again", type=Path, help="compare the runs a --json file kept, without measuring")
    parser.add_argument(
        "--postgres-url", default=os.environ.get("HANDLES_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    )
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
