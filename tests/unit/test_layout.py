"""Tool layouts: the names of each layout, how a client recognises one, and names that would clash."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp.server.mcpserver import MCPServer

from handles import Handles, JobContext
from handles.errors import ConfigurationError
from handles.tool_layout import ToolNames
from tests.support import handles_config, new_key


def test_each_layout_names_the_tools_it_has() -> None:
    per_job, compact = ToolNames.of("per_job"), ToolNames.of("compact")
    assert [per_job.name("report", verb) for verb in ("start", "progress", "fetch", "cancel", "respond")] == [
        "report_start", "report_progress", "report_fetch", "report_cancel", "report_respond",
    ]  # fmt: skip
    assert [compact.name("report", verb) for verb in ("start", "progress", "fetch", "cancel", "respond")] == [
        "report_start", "jobs_progress", "jobs_fetch", "jobs_cancel", "jobs_respond",
    ]  # fmt: skip
    with pytest.raises(ConfigurationError, match="'per_job', 'compact'"):
        ToolNames.of("flat")


def test_a_client_recognises_the_layout_from_the_tool_list() -> None:
    assert ToolNames.discover("report", {"report_start", "report_progress"}) == ToolNames("per_job")
    assert ToolNames.discover("report", {"report_start", "jobs_progress"}) == ToolNames("compact")
    assert ToolNames.discover("report", {"report_start", "report"}) is None


@pytest.mark.parametrize("layout", ["per_job", "compact"])
async def test_names_that_would_clash_are_refused_at_bind(tmp_path: Path, layout: Any) -> None:
    jobs = Handles(handles_config(tmp_path, [new_key()]))

    async def report(ctx: JobContext) -> dict[str, int]:
        return {}

    clashing = "report_progress" if layout == "per_job" else "jobs_progress"
    jobs.job(name="report")(report)
    jobs.job(name=clashing)(report)
    try:
        with pytest.raises(ConfigurationError, match=f"Two tools would be named {clashing}"):
            jobs.bind(MCPServer("clash"), layout=layout)
    finally:
        await jobs.aclose()
