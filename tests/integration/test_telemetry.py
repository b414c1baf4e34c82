"""Metrics and traces of jobs, read with the OpenTelemetry SDK's in-memory exporters.

A job with a question and a durable step runs through the official client: the attempt spans are
linked to the span of the `tools/call` that started the job and carry the step as an event; the
counters, histograms and gauges say what happened; and no attribute carries the principal, an
argument, an answer or a result.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel

from handles import Handles, JobContext, JobFailed
from handles.client import follow
from handles.client.tasks import TasksClientExtension
from tests.support import LOCAL_PRINCIPAL, connect, handles_config

ACCOUNT = "acct-telemetry-7731"
NOTE = "note-telemetry-4410"


class Go(BaseModel):
    go: bool
    note: str


@pytest.fixture(scope="module")
def exporters() -> Iterator[tuple[InMemorySpanExporter, InMemoryMetricReader]]:
    """The process's OpenTelemetry providers (set once per process, as an application would)."""
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    trace.set_tracer_provider(tracer_provider)
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    yield spans, reader


def points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    found: dict[str, list[Any]] = {}
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            if scope.scope.name != "handles":
                continue
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def total(found: dict[str, list[Any]], name: str, kind: str) -> float:
    return sum(p.value for p in found.get(name, []) if p.attributes.get("handles.job.kind") == kind)


async def test_one_job_gives_linked_attempt_spans_with_step_events_and_metrics(
    tmp_path: Path, signing_key: str, exporters: tuple[InMemorySpanExporter, InMemoryMetricReader]
) -> None:
    spans, reader = exporters
    jobs = Handles(handles_config(tmp_path / "data", [signing_key]))

    @jobs.job(asks_input=True)
    async def audit_account(ctx: JobContext, account: str) -> dict[str, str]:
        """Asks before it checks the account in a durable step."""
        answer = await ctx.ask(f"Audit {account}?", Go)
        checked = await ctx.step("check", lambda: {"account": account, "ok": "yes"})
        return {"checked": checked["ok"], "note": answer.note}

    @jobs.job
    async def refuse(ctx: JobContext) -> dict[str, str]:
        """Fails on purpose."""
        raise JobFailed("no")

    server: MCPServer[Any] = MCPServer("telemetry")
    jobs.bind(server)
    try:
        async with connect(server) as client:
            handle = (await client.call("audit_account_start", {"account": ACCOUNT}))["handle"]
            await client.wait_status("audit_account", handle, "input_required")
            while_parked = points(reader)
            await client.call(
                "audit_account_respond", {"handle": handle, "responses": {"q1": {"go": True, "note": NOTE}}}
            )
            done = await client.call("audit_account_fetch", {"handle": handle, "wait_seconds": 20})
            assert done["status"] == "completed"
            failed = (await client.call("refuse_start", {}))["handle"]
            assert (await client.call("refuse_fetch", {"handle": failed, "wait_seconds": 20}))[
                "status"
            ] == "failed"
    finally:
        await jobs.aclose()
    found = points(reader)  # after the runtime stopped: every outcome is counted by now

    finished = spans.get_finished_spans()
    start_call = next(s for s in finished if s.name == "tools/call audit_account_start")
    attempts = [s for s in finished if s.name == "handles.job audit_account"]
    assert len(attempts) == 2  # parked at the question, then run again after the answer
    for span in attempts:
        assert span.parent is None and span.context.trace_id != start_call.context.trace_id
        assert [link.context.span_id for link in span.links] == [start_call.context.span_id]
        assert (
            span.attributes["handles.job.kind"] == "audit_account"
            and span.attributes["handles.job.attempt"] == 1
        )
    last = attempts[-1]
    assert [
        (e.name, e.attributes["handles.step.name"], e.attributes["handles.step.status"]) for e in last.events
    ] == [("handles.step", "check", "completed")]
    assert last.attributes["handles.job.status"] == "completed"
    (refused,) = [s for s in finished if s.name == "handles.job refuse"]
    assert refused.attributes["handles.job.status"] == "failed" and refused.status.status_code.name == "ERROR"

    assert total(found, "handles.jobs.started", "audit_account") == 1
    assert total(found, "handles.jobs.completed", "audit_account") == 1
    assert total(found, "handles.jobs.failed", "refuse") == 1
    (reason,) = [p.attributes.get("handles.job.reason") for p in found["handles.jobs.failed"]]
    assert reason == "job_failed"
    parked = [
        p for p in found["handles.job.parked_time"] if p.attributes["handles.job.kind"] == "audit_account"
    ]
    assert parked and parked[0].count == 1
    runs = [p for p in found["handles.job.run_time"] if p.attributes["handles.job.kind"] == "audit_account"]
    assert runs[0].count == 2
    assert [
        p.count
        for p in found["handles.job.queue_wait"]
        if p.attributes["handles.job.kind"] == "audit_account"
    ] == [1]
    assert total(while_parked, "handles.jobs.parked", "audit_account") == 1  # the gauge, read from the store

    # Nothing personal in any attribute: not the principal, the argument, the answer or the result.
    everything = json.dumps(
        [dict(s.attributes or {}) for s in attempts]
        + [dict(e.attributes or {}) for s in attempts for e in s.events]
        + [dict(p.attributes) for values in found.values() for p in values],
        default=str,
    )
    for personal in (LOCAL_PRINCIPAL, ACCOUNT, NOTE):
        assert personal not in everything


async def test_the_started_counter_says_which_face_started_each_job(
    tmp_path: Path, signing_key: str, exporters: tuple[InMemorySpanExporter, InMemoryMetricReader]
) -> None:
    _, reader = exporters
    jobs = Handles(handles_config(tmp_path / "data", [signing_key]))

    @jobs.job
    async def tally(ctx: JobContext, n: int) -> int:
        """Counts to n."""
        return n

    server: MCPServer[Any] = MCPServer("faces", extensions=[jobs.tasks_extension()])
    jobs.bind(server)
    try:
        async with Client(server) as plain:
            await plain.call_tool("tally_start", {"n": 1})
            await plain.call_tool("tally", {"n": 2})
        async with Client(server, extensions=[TasksClientExtension()]) as declaring:
            assert (await declaring.call_tool("tally", {"n": 3})).structured_content == {"result": 3}
        async with Client(server, mode="legacy") as handshake:  # 2025-11-25: a task of that design
            assert await follow(handshake, "tally", {"n": 4}, prefer="tasks") == {"result": 4}
    finally:
        await jobs.aclose()
    faces = [
        (p.attributes.get("handles.job.face"), p.value)
        for p in points(reader)["handles.jobs.started"]
        if p.attributes["handles.job.kind"] == "tally"
    ]
    assert sorted(faces) == [
        ("handle_tools", 1),
        ("plain_tool", 1),
        ("tasks_2025_11_25", 1),
        ("tasks_extension", 1),
    ]
