"""The charts of docs/performance.md: a full run's user-facing rows, drawn as plain SVG text.

    python bench/charts.py                      # redraw docs/img/performance-*.svg from bench/results/headline.json
    python bench/charts.py --from-run out.json  # first take the figures from a run's JSON (bench/run.py --json)

One chart sets `J_progress`, `J_start`, Tasks creation and pickup against the bare no-op call of the same
rounds (pickup against the least a pickup could take); the other sets start -> result, the plain call and
calls/s against the peer, FastMCP 4 + fastmcp-tasks. Both name the run their figures come from. A full
`python bench/run.py` rewrites bench/results/headline.json from its own tables and redraws them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

REPO_ROOT = Path(__file__).resolve().parent.parent
HEADLINE = REPO_ROOT / "bench" / "results" / "headline.json"
IMG_DIR = REPO_ROOT / "docs" / "img"
AGAINST_BARE = "performance-against-bare-call.svg"
AGAINST_PEER = "performance-against-peer.svg"
CHART_FILES = (AGAINST_BARE, AGAINST_PEER)
TASKS_CREATE = "Tasks create (work, CreateTaskResult)"

LINES = {
    "j_progress": 1.15,
    "j_start": 1.5,
    "tasks_create": 1.5,
    "pickup_ms": 2.0,
    "task_after": 0.5,
    "plain": 1.0,
}
"""The line each drawn row is held to (docs/performance.md's targets), drawn as a dashed mark."""

COLOURS = {"bare": "#9e9e9e", "handles": "#1f6fb4", "peer": "#f28e2b", "line": "#d62728"}
LEGEND = {
    "bare": "the bare call (or the least possible)",
    "handles": "handles",
    "peer": "FastMCP 4 + fastmcp-tasks",
}


class MissingFigures(ValueError):
    """A run's JSON lacks a table or figure the charts need (a partial run, or PostgreSQL unreachable)."""


# -- the figures ------------------------------------------------------------------------------


def load_headline(path: Path) -> dict[str, Any]:
    """The figures the charts draw, as bench/results/headline.json holds them."""
    headline: dict[str, Any] = json.loads(path.read_text())
    return headline


def _data(run: Mapping[str, Any], section: str) -> dict[str, Any]:
    for table in run.get("tables", []):
        if table.get("section") == section and table.get("data"):
            data: dict[str, Any] = table["data"]
            return data
    raise MissingFigures(f"the run has no figures of section {section!r}: the charts need a full run")


def _p50(stats: Mapping[str, Any], *keys: str) -> float:
    node: Any = stats
    for key in keys:
        if not isinstance(node, Mapping) or key not in node:
            raise MissingFigures(f"the run has no figure {'/'.join(keys)!r}")
        node = node[key]
    return float(node["p50_ms"])


def _r(value: float) -> float:
    return round(value, 3)


def git_commit() -> str:
    """This checkout's commit, short, with `-dirty` when the working tree has changes."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("-dirty" if dirty else "")


def headline_from_run(run: Mapping[str, Any], *, commit: str) -> dict[str, Any]:
    """The headline figures of a run's JSON (as bench/run.py writes it): p50 ratios, pickup in ms, calls/s."""
    over, pickup, peer = _data(run, "overhead"), _data(run, "pickup"), _data(run, "peer")

    def vs_noop(transport: str, call: str) -> float:
        return _r(_p50(over, transport, call) / _p50(over, transport, "noop"))

    def vs_peer(key: str) -> float:
        return _r(_p50(peer, key, "handles") / _p50(peer, key, "peer"))

    def calls_per_s(kind: str) -> dict[str, float]:
        figures = peer.get(f"throughput_{kind}")
        if not figures:
            raise MissingFigures(f"the run has no calls/s figure of the {kind} call")
        return {who: _r(float(figures[who][0])) for who in ("handles", "peer")}

    two = peer.get("two_requests_least")
    if not two:
        raise MissingFigures("the run has no figure of a task's two requests")
    date = str(run.get("environment", {}).get("date", "unknown date"))
    return {
        "commit": commit,
        "date": date[:16] + date[19:] if len(date) >= 19 and date[16] == ":" else date,
        "command": str(run.get("environment", {}).get("command", "python bench/run.py")),
        "source": "written by bench/run.py from the run's own tables",
        "figures": {
            "j_progress": {t: vs_noop(t, "work_progress") for t in ("stdio", "http")},
            "j_start": {t: vs_noop(t, "work_start") for t in ("stdio", "http")},
            "tasks_create": {"http": vs_noop("http", TASKS_CREATE)},
            "pickup_postgresql_ms": {
                "as_built": _r(_p50(pickup, "PostgreSQL", "pickup_call")),
                "job_first": _r(_p50(pickup, "PostgreSQL", "pickup_job_first")),
                "least": _r(_p50(pickup, "PostgreSQL", "least")),
            },
            "start_to_result_vs_peer": {
                "task_after": vs_peer("inline_0"),
                "task_at_once": vs_peer("result_0"),
                "two_requests": _r(float(two["handles_ms"]) / float(two["peer_result_0_ms"])),
            },
            "plain_call_vs_peer": vs_peer("plain_0"),
            "calls_per_s": {"plain": calls_per_s("plain"), "tasks": calls_per_s("task")},
        },
    }


# -- the drawing ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    series: str
    value: float
    text: str


@dataclass(frozen=True)
class Row:
    label: str
    bars: tuple[Bar, ...]
    line: float | None = None


@dataclass(frozen=True)
class Panel:
    title: str
    rows: tuple[Row, ...]


WIDTH, LABEL_W, VALUE_W = 780, 300, 70
PLOT_W = WIDTH - LABEL_W - VALUE_W - 20
BAR_H, BAR_GAP, ROW_GAP = 13, 2, 9


def _text(
    x: float, y: float, body: str, *, size: int = 12, anchor: str = "start", weight: str = "normal"
) -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
        f'font-weight="{weight}">{escape(body)}</text>'
    )


def _value(x: float, y: float, body: str) -> str:
    # On a white patch, so a value stays legible where a target's dashed line crosses it.
    patch = f'<rect x="{x - 1:.1f}" y="{y - 10:.1f}" width="{len(body) * 6.3 + 2:.1f}" height="13" fill="#ffffff"/>'
    return patch + _text(x, y, body, size=11)


def render(title: str, caption: str, panels: Sequence[Panel]) -> str:
    """One chart: horizontal bars by row, each panel on its own scale, the rows' lines dashed."""
    body: list[str] = [_text(10, 22, title, size=15, weight="bold"), _text(10, 40, caption, size=11)]
    series = [s for s in LEGEND if any(b.series == s for p in panels for r in p.rows for b in r.bars)]
    x = 10.0
    for name in series:
        body.append(f'<rect x="{x:.1f}" y="50" width="12" height="12" fill="{COLOURS[name]}"/>')
        body.append(_text(x + 16, 60, LEGEND[name], size=11))
        x += 24 + 6.2 * len(LEGEND[name])
    if any(r.line is not None for p in panels for r in p.rows):
        body.append(
            f'<line x1="{x:.1f}" y1="56" x2="{x + 14:.1f}" y2="56" stroke="{COLOURS["line"]}" '
            'stroke-width="2" stroke-dasharray="4 2"/>'
        )
        body.append(_text(x + 18, 60, "target", size=11))
    y = 76.0
    for panel in panels:
        y += 18
        body.append(_text(10, y, panel.title, size=12, weight="bold"))
        y += 8
        top = max(max(b.value for r in panel.rows for b in r.bars), *(r.line or 0 for r in panel.rows))
        scale = PLOT_W / (top * 1.05)
        for row in panel.rows:
            height = len(row.bars) * (BAR_H + BAR_GAP) - BAR_GAP
            body.append(_text(LABEL_W - 8, y + height / 2 + 4, row.label, anchor="end"))
            values: list[str] = []
            for i, bar in enumerate(row.bars):
                by = y + i * (BAR_H + BAR_GAP)
                width = max(bar.value * scale, 1.0)
                body.append(
                    f'<rect x="{LABEL_W}" y="{by:.1f}" width="{width:.1f}" height="{BAR_H}" '
                    f'fill="{COLOURS[bar.series]}"/>'
                )
                values.append(_value(LABEL_W + width + 4, by + BAR_H - 2, bar.text))
            if row.line is not None:
                lx = LABEL_W + row.line * scale
                body.append(
                    f'<line x1="{lx:.1f}" y1="{y - 3:.1f}" x2="{lx:.1f}" y2="{y + height + 3:.1f}" '
                    f'stroke="{COLOURS["line"]}" stroke-width="2" stroke-dasharray="4 2"/>'
                )
            body += values
            y += height + ROW_GAP
    height_total = int(y + 10)
    return "\n".join(
        [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height_total}" '
            f'viewBox="0 0 {WIDTH} {height_total}" font-family="sans-serif" role="img">',
            f"<title>{escape(title)}</title>",
            f'<rect width="{WIDTH}" height="{height_total}" fill="#ffffff"/>',
            *body,
            "</svg>",
            "",
        ]
    )


def _x(value: float) -> str:
    return f"{value:.2f}x"


def _pair(label: str, ratio: float, line: float | None, base: str = "bare") -> Row:
    return Row(label, (Bar(base, 1.0, "1.00x"), Bar("handles", ratio, _x(ratio))), line)


def against_bare(figures: Mapping[str, Any]) -> list[Panel]:
    """Each latency row over the bare no-op call of its own rounds; pickup in ms over its least."""
    progress, start, pickup = figures["j_progress"], figures["j_start"], figures["pickup_postgresql_ms"]
    ratios = Panel(
        "p50 over the bare no-op call of the same rounds (1.00x = the bare call; lower is better)",
        (
            _pair("J_progress (a poll), stdio", progress["stdio"], LINES["j_progress"]),
            _pair("J_progress (a poll), HTTP", progress["http"], LINES["j_progress"]),
            _pair("J_start (a durable start), stdio", start["stdio"], LINES["j_start"]),
            _pair("J_start (a durable start), HTTP", start["http"], LINES["j_start"]),
            _pair("Tasks create, HTTP", figures["tasks_create"]["http"], LINES["tasks_create"]),
        ),
    )
    line = LINES["pickup_ms"]
    pick = Panel(
        "pickup on PostgreSQL, p50 ms: start called -> the job running (lower is better)",
        (
            Row(
                "least possible: bare SDK call + driver insert",
                (Bar("bare", pickup["least"], f"{pickup['least']:.2f} ms"),),
                line,
            ),
            Row(
                "handles (its reply first)",
                (Bar("handles", pickup["as_built"], f"{pickup['as_built']:.2f} ms"),),
                line,
            ),
            Row(
                "handles, the job before its reply",
                (Bar("handles", pickup["job_first"], f"{pickup['job_first']:.2f} ms"),),
                line,
            ),
        ),
    )
    return [ratios, pick]


def against_peer(figures: Mapping[str, Any]) -> list[Panel]:
    """Start -> result and the plain call as a fraction of the peer's; calls/s side by side."""
    result, tput = figures["start_to_result_vs_peer"], figures["calls_per_s"]
    latency = Panel(
        "p50 as a fraction of the peer's, Streamable HTTP (1.00x = the peer; lower is better)",
        (
            _pair("start -> result, 0 s job (task_after)", result["task_after"], LINES["task_after"], "peer"),
            Row(
                "start -> result, 0 s job (a task at once)",
                (
                    Bar("peer", 1.0, "1.00x"),
                    Bar(
                        "bare",
                        result["two_requests"],
                        _x(result["two_requests"]) + " (its two bare requests)",
                    ),
                    Bar("handles", result["task_at_once"], _x(result["task_at_once"])),
                ),
            ),
            _pair("plain call, 0 s job (inline)", figures["plain_call_vs_peer"], LINES["plain"], "peer"),
        ),
    )

    def calls(label: str, kind: str) -> Row:
        peer, mine = tput[kind]["peer"], tput[kind]["handles"]
        return Row(label, (Bar("peer", peer, f"{peer:.0f}"), Bar("handles", mine, f"{mine:.0f}")))

    throughput = Panel(
        "calls/s, 8 concurrent clients (higher is better)",
        (calls("plain call (inline)", "plain"), calls("Tasks: create -> poll -> result", "tasks")),
    )
    return [latency, throughput]


def draw_all(headline: Mapping[str, Any]) -> dict[str, str]:
    """Every chart's SVG text by file name."""
    caption = f"Full run of {headline['date']} on commit {headline['commit']} (bench/results/headline.json)"
    figures = headline["figures"]
    return {
        AGAINST_BARE: render("What durability costs against the bare call", caption, against_bare(figures)),
        AGAINST_PEER: render("handles against FastMCP 4 + fastmcp-tasks", caption, against_peer(figures)),
    }


def write_charts(headline: Mapping[str, Any], img_dir: Path = IMG_DIR) -> list[Path]:
    img_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, svg in draw_all(headline).items():
        path = img_dir / name
        path.write_text(svg)
        written.append(path)
    return written


def record_run(
    run: Mapping[str, Any], *, commit: str | None = None, headline: Path = HEADLINE, img_dir: Path = IMG_DIR
) -> list[Path]:
    """Take a full run's headline figures into `headline` and redraw the charts from them."""
    figures = headline_from_run(run, commit=commit or git_commit())
    headline.parent.mkdir(parents=True, exist_ok=True)
    headline.write_text(json.dumps(figures, indent=2) + "\n")
    return write_charts(figures, img_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/charts.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--from-run", type=Path, help="a run's JSON (bench/run.py --json): take its figures first"
    )
    parser.add_argument(
        "--commit", help="with --from-run: the commit the run was made on (default: this checkout's)"
    )
    args = parser.parse_args(argv)
    try:
        if args.from_run:
            written = record_run(json.loads(args.from_run.read_text()), commit=args.commit)
        else:
            written = write_charts(load_headline(HEADLINE))
    except MissingFigures as exc:
        print(f"charts not drawn: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
