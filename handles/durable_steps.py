"""Durable steps: `ctx.step`, a function run at most once over a job's life, its result recorded."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio.to_thread
from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

from handles.errors import StepOutcomeUnknown
from handles.limits import clean_message
from handles.telemetry import Telemetry

if TYPE_CHECKING:
    from handles.runtime.job_writes import JobWrites
    from handles.sealing import Redactor


class DurableSteps:
    """The part of `JobContext` that runs durable steps (its state is set up by `JobContext.__init__`)."""

    job_id: str
    attempt: int
    redact: Redactor
    _writes: JobWrites
    _step_names: set[str]
    _completed: dict[str, Any]
    _running_steps: set[str]
    _interrupt_pending: bool

    if TYPE_CHECKING:

        @property
        def kind(self) -> str: ...

    async def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        repeatable: bool = False,
        recheck: Callable[[], Any] | None = None,
        result_type: Any = None,
        **kwargs: Any,
    ) -> Any:
        """Run `fn(*args, **kwargs)` at most once over the job's life and record its result (as JSON).

        A retry that reaches a completed step gets the recorded result back (rebuilt as `result_type` if
        given) without running `fn`. A step started earlier with no recorded outcome raises
        `StepOutcomeUnknown`, unless it is `repeatable` (run again) or has a `recheck` (its answer is
        recorded). Step names must be unique within a job.
        """
        if name in self._step_names:
            raise ValueError(
                f"Step name {name!r} is used twice in job {self.kind!r}; give every step its own name."
            )
        if repeatable and recheck is not None:
            raise ValueError(
                f"Step {name!r} of job {self.kind!r} is repeatable and has a recheck: a step safe to "
                "repeat runs again after a crash and needs no recheck; drop one of the two."
            )
        self._step_names.add(name)
        if name in self._completed:  # replayed: recorded by an earlier run
            Telemetry.step(name, "replayed")
            return _typed(self._completed[name], result_type)
        self._running_steps.add(name)  # before any await: a cancel now waits for this step
        try:
            stored = await self._run_step(name, fn, args, kwargs, recheck, repeatable)
        finally:
            self._running_steps.discard(name)
            if self._interrupt_pending and not self._running_steps:
                # A cancel or a shutdown waited for the step to be recorded: stop here.
                raise asyncio.CancelledError("interrupted after the running steps were recorded")
        return _typed(stored, result_type)

    async def _run_step(
        self,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        recheck: Callable[[], Any] | None,
        repeatable: bool,
    ) -> Any:
        attempt = self.attempt  # the step's start: its outcome is written for it even if the lease moves
        record, fresh = await self._writes.begin_step(name, attempt, repeatable=repeatable)
        if not fresh and record.status == "completed":
            return record.result
        if not fresh:
            if recheck is None:
                raise StepOutcomeUnknown(name, record.started_at.isoformat(), record.attempt)
            value = await _invoke(recheck)
        else:
            try:
                value = await _invoke(fn, *args, **kwargs)
            except Exception as exc:
                error = clean_message(self.redact(f"{type(exc).__name__}: {exc}"))
                await self._writes.finish_step(name, attempt, error=error)
                Telemetry.step(name, "failed")
                raise
        stored = to_jsonable_python(value)
        await self._writes.finish_step(name, attempt, result=stored)
        Telemetry.step(name, "completed")
        return stored


async def _invoke(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Await an async callable; run a plain one on a worker thread so it cannot block the event loop."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    value = await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))
    return await value if inspect.isawaitable(value) else value


def _typed(value: Any, result_type: Any) -> Any:
    return value if result_type is None else TypeAdapter(result_type).validate_python(value)
