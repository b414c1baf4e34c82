"""Fixtures of the `handles.client` tests: the Tasks test server in-process with counters on what
the server receives (starts, `tasks/get`, `<job>_progress`), and clients with or without the Tasks
extension."""

from __future__ import annotations

import secrets
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer

from handles import Handles
from handles.client import Journal
from handles.client.tasks import TasksClientExtension
from handles.server.handle_tools import JobTools
from handles.server.tasks_extension import TasksExtension
from tests.tasks.app import build_test_server, create_test_jobs, tasks_config


@dataclass
class Counted:
    """The Tasks test server, and the moments at which it received each kind of request."""

    jobs: Handles
    server: MCPServer[Any]
    calls: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def jobs_of(self, kind: str) -> int:
        """How many jobs of `kind` the store holds: the number of starts that created a job."""
        return len(self.jobs.service.store.repo.list_jobs(kind=kind, limit=1000))

    def client(self, *, tasks: bool = True, **options: Any) -> Client:
        # push=False: these tests count and time tasks/get polls (pushes: tests/tasks/test_pushed_status.py)
        extensions = [TasksClientExtension(push=False)] if tasks else None
        return Client(self.server, extensions=extensions, **options)


@pytest.fixture
async def counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Counted]:
    calls: dict[str, list[float]] = defaultdict(list)
    get_task, progress, start, intercept = (
        TasksExtension.get_task,
        JobTools.progress,
        JobTools.start,
        TasksExtension.intercept_tool_call,
    )

    async def counting_get(self: Any, ctx: Any, params: Any) -> Any:
        calls["tasks/get"].append(time.monotonic())
        return await get_task(self, ctx, params)

    async def counting_progress(self: Any, principal: str, arguments: dict[str, Any]) -> Any:
        calls["progress"].append(time.monotonic())
        return await progress(self, principal, arguments)

    async def counting_start(self: Any, principal: str, arguments: dict[str, Any]) -> Any:
        calls["start"].append(time.monotonic())
        return await start(self, principal, arguments)

    async def counting_intercept(self: Any, params: Any, ctx: Any, call_next: Any) -> Any:
        calls[f"tools/call {params.name}"].append(time.monotonic())
        return await intercept(self, params, ctx, call_next)

    # Patched before the server is built: the tools and the Tasks methods bind these at construction.
    monkeypatch.setattr(TasksExtension, "get_task", counting_get)
    monkeypatch.setattr(TasksExtension, "intercept_tool_call", counting_intercept)
    monkeypatch.setattr(JobTools, "progress", counting_progress)
    monkeypatch.setattr(JobTools, "start", counting_start)
    jobs = create_test_jobs(tasks_config(tmp_path / "data", secrets.token_urlsafe(48)))
    async with jobs.running():
        yield Counted(jobs, build_test_server(jobs), calls)


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    """An empty journal in a file of its own."""
    return Journal(tmp_path / "journal.db")
