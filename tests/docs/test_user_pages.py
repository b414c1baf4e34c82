"""The user pages read as user pages: no journal of changes, no path of the machine a run was made on.

The performance page is a five-minute read whose charts are the ones `bench/charts.py` draws.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
JOURNAL = re.compile(r"[Ii]ssues? [0-9]+|[Cc]hanges? [0-9]+|section [0-9]+ of issue|/tmp/")
PERFORMANCE = ROOT / "docs" / "performance.md"


def test_no_page_names_an_issue_a_change_or_a_path_of_a_run() -> None:
    found = [
        f"{page.relative_to(ROOT)}:{number}: {match.group(0)!r}"
        for page in PAGES
        for number, line in enumerate(page.read_text().splitlines(), 1)
        for match in JOURNAL.finditer(line)
    ]
    assert not found, "journal references in the user docs:\n" + "\n".join(found[:40])


def test_the_performance_page_is_a_short_read() -> None:
    lines = PERFORMANCE.read_text().splitlines()
    assert len(lines) <= 400, (
        f"docs/performance.md has {len(lines)} lines; keep it a page a user reads in minutes"
    )


def test_the_performance_page_shows_the_charts_bench_draws() -> None:
    from bench import charts

    text = PERFORMANCE.read_text()
    for name in charts.CHART_FILES:
        assert (ROOT / "docs" / "img" / name).is_file(), (
            f"docs/img/{name} is missing: run python bench/charts.py"
        )
        assert f"img/{name}" in text, f"docs/performance.md does not show img/{name}"
