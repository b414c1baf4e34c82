"""Metrics and traces through the OpenTelemetry API: no-ops until the application installs the SDK.

`handles` only uses `opentelemetry-api` (which the `mcp` SDK already requires); an application
that installs the SDK (`pip install 'mcp-handles[otel]'`) and sets a meter and a tracer provider
gets, under the instrumentation scope `handles`:

- counters `handles.jobs.started`, `.completed`, `.failed`, `.cancelled`, `.recovered` (attribute
  `handles.job.kind`; failures also `handles.job.reason`);
- histograms `handles.job.queue_wait`, `handles.job.run_time` (per attempt) and
  `handles.job.parked_time` (from a question to its answer), in seconds;
- observable gauges `handles.jobs.running` (this node), `handles.jobs.queued` and
  `handles.jobs.parked` (the whole store, per kind: every node reports the same value);
- one span per attempt, `handles.job <kind>`, linked to the span of the request that started the
  job (its W3C trace context is stored with the job, so any node links it), with each durable
  step as an event.

No attribute carries a principal, an argument, an answer or a result: only the job's kind, id,
attempt, status and failure reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.trace import Link, Span, SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

SCOPE = "handles"
KIND = "handles.job.kind"
REASON = "handles.job.reason"
_PROPAGATOR = TraceContextTextMapPropagator()  # trace context only: baggage may carry anything


def start_context() -> dict[str, str] | None:
    """The W3C trace context of the current span (the request starting a job), to store with the job."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier or None


class Telemetry:
    """The instruments of one process. Cheap when no SDK is installed: every call is a no-op."""

    def __init__(self) -> None:
        meter = metrics.get_meter(SCOPE)
        self.tracer = trace.get_tracer(SCOPE)
        self._started = meter.create_counter("handles.jobs.started", description="Jobs started.")
        self._ended = {
            status: meter.create_counter(f"handles.jobs.{status}", description=f"Jobs {status}.")
            for status in ("completed", "failed", "cancelled")
        }
        self._recovered = meter.create_counter(
            "handles.jobs.recovered", description="Jobs whose node died, settled or retried by another."
        )
        self._queue_wait = meter.create_histogram(
            "handles.job.queue_wait", unit="s", description="From a job's start to its first claim."
        )
        self._run_time = meter.create_histogram(
            "handles.job.run_time",
            unit="s",
            description="One attempt of a job, from claim to outcome or park.",
        )
        self._parked_time = meter.create_histogram(
            "handles.job.parked_time", unit="s", description="From a question to its answer."
        )
        self._meter = meter

    def observe(
        self,
        running: Callable[[], dict[str, int]],
        stored: Callable[[], dict[tuple[str, str], int]],
    ) -> None:
        """Register the gauges: `running()` counts this node's jobs per kind; `stored()` counts the
        store's jobs per (kind, status) for the queued and parked states."""

        def gauge(
            values: Callable[[], Iterable[tuple[str, int]]],
        ) -> Callable[[Any], Iterable[metrics.Observation]]:
            def callback(_options: Any) -> Iterable[metrics.Observation]:
                try:
                    return [metrics.Observation(count, {KIND: kind}) for kind, count in values()]
                except Exception:  # a database away: no observation this time, never an exporter crash
                    return []

            return callback

        def of_status(status: str) -> Callable[[], Iterable[tuple[str, int]]]:
            return lambda: [(kind, n) for (kind, state), n in stored().items() if state == status]

        self._meter.create_observable_gauge(
            "handles.jobs.running",
            [gauge(lambda: running().items())],
            description="Jobs running on this node.",
        )
        self._meter.create_observable_gauge(
            "handles.jobs.queued", [gauge(of_status("queued"))], description="Jobs waiting for a worker."
        )
        self._meter.create_observable_gauge(
            "handles.jobs.parked", [gauge(of_status("parked"))], description="Jobs waiting for an answer."
        )

    def started(self, kind: str) -> None:
        self._started.add(1, {KIND: kind})

    def ended(self, kind: str, status: str, reason: str | None = None) -> None:
        counter = self._ended.get(status)
        if counter is not None:
            counter.add(1, {KIND: kind, REASON: reason} if reason else {KIND: kind})

    def recovered(self, kind: str) -> None:
        self._recovered.add(1, {KIND: kind})

    def queue_wait(self, kind: str, seconds: float) -> None:
        self._queue_wait.record(max(seconds, 0.0), {KIND: kind})

    def run_time(self, kind: str, seconds: float) -> None:
        self._run_time.record(max(seconds, 0.0), {KIND: kind})

    def parked_time(self, kind: str, seconds: float) -> None:
        self._parked_time.record(max(seconds, 0.0), {KIND: kind})

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
