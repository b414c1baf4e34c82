"""Metrics and traces through the OpenTelemetry API (no-ops until the application installs the SDK); no
attribute carries a principal, an argument, an answer or a result."""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

from opentelemetry import metrics, trace
from opentelemetry.trace import Link, Span, SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

SCOPE = "handles"
KIND = "handles.job.kind"
REASON = "handles.job.reason"
FACE = "handles.job.face"
"""Which face started a job: `handle_tools`, `plain_tool`, `tasks_extension` or `tasks_2025_11_25`."""
ENDED = ("completed", "failed", "cancelled")
Duration = Literal["queue_wait", "run_time", "parked_time"]
_PROPAGATOR = TraceContextTextMapPropagator()  # trace context only: baggage may carry anything


def start_context() -> dict[str, str] | None:
    """The W3C trace context of the current span (the request starting a job), to store with the job."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier or None


class _Sources:
    """What the gauges read: every live runtime of this process (weakly held; usually one)."""

    def __init__(self) -> None:
        self.running: weakref.WeakSet[Any] = weakref.WeakSet()

    def running_by_kind(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for source in list(self.running):
            counts.update(source.running_by_kind())  # in memory: cannot fail
        return counts

    def stored(self, status: str) -> dict[str, int]:
        """The store's waiting jobs per kind, from each distinct database (read once each)."""
        counts: Counter[str] = Counter()
        seen: set[str] = set()
        for source in list(self.running):
            repo = source.store.repo
            database = str(repo.engine.url)
            if database in seen:
                continue
            seen.add(database)
            try:
                waiting = repo.waiting_counts()
            except Exception:  # this database is away: the others still count
                continue
            counts.update({kind: n for (kind, state), n in waiting.items() if state == status})
        return counts


@functools.cache
def _instruments() -> tuple[dict[str, Any], _Sources]:
    """The process's instruments, made once: an instrument of a name exists once per meter, so every
    `Handles` instance of the process shares them, and the gauges read every live runtime."""
    meter = metrics.get_meter(SCOPE)
    sources = _Sources()

    def gauge(values: Callable[[], dict[str, int]]) -> Callable[[Any], Iterable[metrics.Observation]]:
        def callback(_options: Any) -> Iterable[metrics.Observation]:
            try:
                return [metrics.Observation(count, {KIND: kind}) for kind, count in values().items()]
            except Exception:  # a database away: no observation this time, never an exporter crash
                return []

        return callback

    for name, values, description in (
        ("running", sources.running_by_kind, "Jobs running on this node."),
        ("queued", lambda: sources.stored("queued"), "Jobs waiting for a worker."),
        ("parked", lambda: sources.stored("parked"), "Jobs waiting for an answer."),
    ):
        meter.create_observable_gauge(f"handles.jobs.{name}", [gauge(values)], description=description)
    instruments: dict[str, Any] = {}
    for name, description in (
        ("started", "Jobs started."),
        *((status, f"Jobs {status}.") for status in ENDED),
        ("recovered", "Jobs whose node died, settled or retried by another."),
    ):
        instruments[name] = meter.create_counter(f"handles.jobs.{name}", description=description)
    for name, description in (
        ("queue_wait", "From a job's start to its first claim."),
        ("run_time", "One attempt of a job, from claim to outcome or park."),
        ("parked_time", "From a question to its answer."),
    ):
        instruments[name] = meter.create_histogram(f"handles.job.{name}", unit="s", description=description)
    return instruments, sources


class Telemetry:
    """The instruments, as one runtime uses them. Cheap when no SDK is installed: every call is a no-op."""

    def __init__(self) -> None:
        self.tracer = trace.get_tracer(SCOPE)
        self._instruments, self._sources = _instruments()

    def observe(self, runtime: Any) -> None:
        """Count `runtime` in the gauges for as long as it lives."""
        self._sources.running.add(runtime)

    def forget(self, runtime: Any) -> None:
        """`runtime` stopped: the gauges no longer read it."""
        self._sources.running.discard(runtime)

    def started(self, kind: str, face: str | None = None) -> None:
        self._instruments["started"].add(1, {KIND: kind} if face is None else {KIND: kind, FACE: face})

    def ended(self, kind: str, status: str, reason: str | None = None) -> None:
        if status in ENDED:
            self._instruments[status].add(1, {KIND: kind, REASON: reason} if reason else {KIND: kind})

    def recovered(self, kind: str) -> None:
        self._instruments["recovered"].add(1, {KIND: kind})

    def duration(self, name: Duration, kind: str, seconds: float) -> None:
        """Record one of the histograms (`queue_wait`, `run_time`, `parked_time`) for a job of `kind`."""
        self._instruments[name].record(max(seconds, 0.0), {KIND: kind})

    @contextlib.contextmanager
    def attempt(
        self, kind: str, job_id: str, attempt: int, started_by: dict[str, str] | None
    ) -> Iterator[Span]:
        """The span of one attempt, linked to the request that started the job (when its context was kept)."""
        links = []
        if started_by:
            origin = trace.get_current_span(_PROPAGATOR.extract(started_by)).get_span_context()
            if origin.is_valid:
                links.append(Link(origin))
        with self.tracer.start_as_current_span(
            f"handles.job {kind}",
            context=trace.set_span_in_context(trace.INVALID_SPAN),  # a root: the request has long ended
            kind=SpanKind.INTERNAL,
            links=links,
            attributes={KIND: kind, "handles.job.id": job_id, "handles.job.attempt": attempt},
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield span

    @staticmethod
    def step(name: str, status: str) -> None:
        """An event on the current attempt's span: a durable step ended (`completed`, `failed`, `replayed`)."""
        trace.get_current_span().add_event(
            "handles.step", {"handles.step.name": name, "handles.step.status": status}
        )

    @staticmethod
    def outcome(span: Span, status: str, reason: str | None) -> None:
        span.set_attribute("handles.job.status", status)
        if reason:
            span.set_attribute(REASON, reason)
        if status == "failed":
            span.set_status(StatusCode.ERROR, reason or "failed")
