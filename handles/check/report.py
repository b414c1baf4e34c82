"""What `handles check` prints and writes: a table for a terminal, JSON and JUnit XML for CI."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class GateResult:
    """One gate's verdict and the evidence behind it; `applied` is False when nothing here was tested."""

    name: str
    passed: bool
    evidence: list[str]
    applied: bool = True


def one_line(text: str) -> str:
    """`text` on one line with nothing a terminal would interpret (newlines, escapes) left in it."""
    return "".join(c if c.isprintable() else " " for c in text)


def aligned(rows: list[list[str]], headers: list[str]) -> str:
    """`rows` under `headers`, each cell `one_line`, each column as wide as its widest cell (the `handles`
    commands' tables)."""
    cells = [[one_line(cell) for cell in row] for row in [headers, *rows]]
    widths = [max(map(len, column)) for column in zip(*cells, strict=True)]
    return "\n".join("  ".join(map(str.ljust, row, widths)).rstrip() for row in cells)


def table(results: list[GateResult], *, verbose: bool = False) -> str:
    """A gate per line, then the evidence of each failed gate (of every gate when `verbose`)."""
    rows = []
    for result in results:
        verdict = "n/a" if not result.applied else "passed" if result.passed else "FAILED"
        checked = sum(line.startswith(("ok:", "FAILED:")) for line in result.evidence)
        rows.append([result.name, verdict, str(checked)])
    lines = [aligned(rows, ["gate", "result", "claims"])]
    for result in results:
        if verbose or not result.passed:
            lines += ["", f"{result.name}:", *(f"  {one_line(line)}" for line in result.evidence)]
    return "\n".join(lines)


def write_json(results: list[GateResult], path: Path) -> None:
    path.write_text(json.dumps([asdict(result) for result in results], indent=2) + "\n")


def write_junit(results: list[GateResult], path: Path) -> None:
    """One test case per gate; a failed gate carries its evidence in a `<failure>`."""
    failures = sum(not result.passed for result in results)
    suite = ET.Element("testsuite", name="handles check", tests=str(len(results)), failures=str(failures))
    for result in results:
        case = ET.SubElement(suite, "testcase", classname="handles.check", name=result.name)
        evidence = "\n".join(result.evidence)
        if not result.passed:
            failed = [line for line in result.evidence if line.startswith("FAILED")]
            ET.SubElement(case, "failure", message=(failed or ["failed"])[0][:500]).text = evidence
        elif not result.applied:
            ET.SubElement(case, "skipped", message="nothing on this server to test")
        ET.SubElement(case, "system-out").text = evidence
    ET.ElementTree(suite).write(path, encoding="unicode", xml_declaration=True)
