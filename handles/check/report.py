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


def table(results: list[GateResult], *, verbose: bool = False) -> str:
    """A gate per line, then the evidence of each failed gate (of every gate when `verbose`)."""
    width = max((len(result.name) for result in results), default=4)
    lines = [f"{'gate':<{width}}  result  claims"]
    for result in results:
        verdict = "n/a" if not result.applied else "passed" if result.passed else "FAILED"
        checked = sum(line.startswith(("ok:", "FAILED:")) for line in result.evidence)
        lines.append(f"{result.name:<{width}}  {verdict:<6}  {checked}")
    for result in results:
        if verbose or not result.passed:
            lines += ["", f"{result.name}:", *(f"  {line}" for line in result.evidence)]
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
