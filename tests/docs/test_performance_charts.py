"""`bench/charts.py` draws the performance page's charts from a file, and a full bench run redraws them."""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench import charts, run
from bench.common import Table

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_charts_are_drawn_from_the_committed_figures() -> None:
    headline = charts.load_headline(charts.HEADLINE)
    drawn = charts.draw_all(headline)
    assert sorted(drawn) == sorted(charts.CHART_FILES)
    for name, svg in drawn.items():
        committed = (ROOT / "docs" / "img" / name).read_text()
        assert committed == svg, f"docs/img/{name} is stale: run python bench/charts.py"


def test_each_chart_is_svg_that_names_its_run() -> None:
    headline = charts.load_headline(charts.HEADLINE)
    for name, svg in charts.draw_all(headline).items():
        root = ET.fromstring(svg)
        assert root.tag == "{http://www.w3.org/2000/svg}svg", name
        assert headline["commit"] in svg and headline["date"] in svg, name
        assert "handles" in svg


def _stats(p50: float) -> dict[str, float]:
    return {"n": 100, "p50_ms": p50, "p90_ms": p50, "p99_ms": p50}


def _run_json() -> dict[str, Any]:
    overhead = {
        transport: {
            "noop": _stats(2.0),
            "work_progress": _stats(2.2),
            "work_start": _stats(3.0),
            "Tasks create (work, CreateTaskResult)": _stats(2.4),
        }
        for transport in ("inprocess", "stdio", "http")
    }
    pickup = {
        "PostgreSQL": {"pickup_call": _stats(2.5), "pickup_job_first": _stats(1.4), "least": _stats(0.9)},
    }
    peer = {
        "result_0": {"handles": _stats(6.0), "peer": _stats(10.0)},
        "inline_0": {"handles": _stats(4.0), "peer": _stats(10.0)},
        "plain_0": {"handles": _stats(5.0), "peer": _stats(5.0)},
        "two_requests_least": {"handles_ms": 5.5, "peer_result_0_ms": 10.0},
        "throughput_task": {"handles": [300.0, 0, 3.0], "peer": [100.0, 0, 9.0]},
        "throughput_plain": {"handles": [500.0, 0, 1.5], "peer": [400.0, 0, 1.8]},
    }
    tables = [
        Table(section=section, title=section, columns=[], data=data).as_dict()
        for section, data in (("overhead", overhead), ("pickup", pickup), ("peer", peer))
    ]
    return {
        "environment": {"date": "2026-12-05 10:00:00 UTC", "command": "python bench/run.py"},
        "tables": tables,
    }


def test_a_run_json_gives_the_figures_the_charts_draw() -> None:
    headline = charts.headline_from_run(_run_json(), commit="abc1234")
    assert headline["commit"] == "abc1234"
    assert headline["date"] == "2026-12-05 10:00 UTC"
    figures = headline["figures"]
    assert figures["j_progress"] == {"stdio": 1.1, "http": 1.1}
    assert figures["j_start"] == {"stdio": 1.5, "http": 1.5}
    assert figures["tasks_create"] == {"http": 1.2}
    assert figures["pickup_postgresql_ms"] == {"as_built": 2.5, "job_first": 1.4, "least": 0.9}
    assert figures["start_to_result_vs_peer"] == {
        "task_after": 0.4,
        "task_at_once": 0.6,
        "two_requests": 0.55,
    }
    assert figures["plain_call_vs_peer"] == 1.0
    assert figures["calls_per_s"] == {
        "plain": {"handles": 500.0, "peer": 400.0},
        "tasks": {"handles": 300.0, "peer": 100.0},
    }
    for svg in charts.draw_all(headline).values():
        ET.fromstring(svg)


def test_a_run_without_the_peer_says_which_figures_are_missing() -> None:
    partial = _run_json()
    partial["tables"] = [t for t in partial["tables"] if t["section"] != "peer"]
    with pytest.raises(charts.MissingFigures, match="peer"):
        charts.headline_from_run(partial, commit="abc1234")


def test_record_run_writes_the_figures_and_the_charts(tmp_path: Path) -> None:
    written = charts.record_run(_run_json(), commit="abc1234", headline=tmp_path / "h.json", img_dir=tmp_path)
    assert json.loads((tmp_path / "h.json").read_text())["commit"] == "abc1234"
    assert sorted(p.name for p in written) == sorted(charts.CHART_FILES)
    assert all(p.parent == tmp_path for p in written)


async def _bench(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> list[dict[str, Any]]:
    recorded: list[dict[str, Any]] = []

    async def no_tables(options: Any) -> list[Table]:
        return []

    monkeypatch.setattr(run, "_module", lambda name: SimpleNamespace(run=no_tables))
    monkeypatch.setattr(run, "environment", lambda options: {"date": "2026-12-05 10:00:00 UTC"})
    monkeypatch.setattr(charts, "record_run", lambda results, **kw: recorded.append(results) or [])
    args: argparse.Namespace = run.parse(argv)
    assert await run.main_async(args, "python bench/run.py " + " ".join(argv)) == 0
    return recorded


async def test_a_full_run_redraws_the_charts(monkeypatch: pytest.MonkeyPatch) -> None:
    recorded = await _bench(monkeypatch, [])
    assert len(recorded) == 1 and "tables" in recorded[0]


@pytest.mark.parametrize("argv", [["--quick"], ["--only", "overhead"], ["--no-peer"]])
async def test_a_partial_run_leaves_the_charts(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    assert await _bench(monkeypatch, argv) == []
