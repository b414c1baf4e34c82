"""A claimed job's run: its call, what it raised as an outcome and that outcome's write; its cancels and interrupts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import sys
import traceback
from collections import Counter
from typing import TYPE_CHECKING, Any

from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent

from handles.errors import JobFailed, LeaseLost, StepOutcomeUnknown, StoreUnavailable
from handles.jobs import JobParked, JobSpec, UndeclaredAsk
from handles.limits import clean_message, json_size, sized_json
from handles.outcomes import (
    Outcome,
    cancelled_at_request,
    cancelled_with_unknown_steps,
    failed,
    result_to_json,
)
from handles.results import ResultFile, linked_result
from handles.runtime.result_files import ResultTooLarge, write_result_file
from handles.runtime.state import RunLife, RunningJob, RuntimeState
from handles.sealing import SealedValueUnreadable
from handles.states import Status
from handles.store import JobRecord
from handles.store.models import claims_of

if TYPE_CHECKING:
    from opentelemetry.trace import Span

logger = logging.getLogger("handles.runtime")

REPLY_FIRST_TURNS = 8
"""How many turns of the event loop a job started here waits before its first step, so that the starting
request's reply goes out first (docs/performance.md)."""


def tool_errors() -> tuple[type[Exception], ...]:
    """What a job raises to end `completed` with a tool error: the SDK's `ToolError`, and FastMCP's once loaded."""
    fastmcp = sys.modules.get("fastmcp.exceptions")
    return (ToolError,) if fastmcp is None else (ToolError, fastmcp.ToolError)


class JobRunner(RuntimeState):
    """The part of `Runtime` that runs a job it holds, interrupts it, and writes how the run ended."""

    def signal_cancel(self, job_id: str) -> bool:
        """Tell a job running here that a cancel was requested; interrupt it after the grace period."""
        entry = self._running.get(job_id)
        if entry is None or entry.ctx.cancelled:
            return entry is not None
        entry.ctx._cancel_requested.set()
        self.store.notifier.notify(job_id)
        loop = asyncio.get_running_loop()
        entry.timers.append(loop.call_later(self.config.cancel_grace_seconds, self._interrupt, entry))
        return True

    def _interrupt(self, entry: RunningJob) -> None:
        """Interrupt a run now, or, while durable steps execute, as soon as they are recorded."""
        if entry.task is None or entry.task.done() or entry.life is RunLife.SETTLING:
            return
        if not entry.ctx.steps_running:
            entry.task.cancel()
            return
        if entry.ctx._interrupt_after_steps():
            limit = self.config.step_cancel_limit_seconds
            loop = asyncio.get_running_loop()
            entry.timers.append(loop.call_later(limit, self._steps_overran, entry))

    def _steps_overran(self, entry: RunningJob) -> None:
        """A cancelled job's steps outlived the hard limit: end it now, with those steps outcome-unknown."""
        steps = sorted(entry.ctx.steps_running)
        if not steps or entry.task is None or entry.task.done() or not entry.ctx.cancelled:
            return
        # The run goes on in its thread; nothing it writes is taken any more.
        if not entry.enter(RunLife.LOST):
            return
        job_id = entry.ctx.job_id
        logger.warning(
            "job %s: step(s) %s still running past the cancel limit; outcome unknown", job_id, steps
        )
        self._spawn(
            self._end_with_unknown_steps(job_id, entry.ctx.principal, steps), f"handles-unknown-{job_id}"
        )

    async def _end_with_unknown_steps(self, job_id: str, principal: str, steps: list[str]) -> None:
        by = await self._cancel_requester(job_id)
        limit = self.config.step_cancel_limit_seconds
        status, values = cancelled_with_unknown_steps(steps, limit, by, principal)
        repo = self.store.repo
        await self._write_held(job_id, "changed", repo.end_with_unknown_steps, steps, status, **values)

    async def _cancelled(self, record: JobRecord) -> Outcome:
        """The outcome of a run interrupted by a cancel: its message says who asked for it."""
        return cancelled_at_request(await self._cancel_requester(record.id), record.principal)

    async def _cancel_requester(self, job_id: str) -> str | None:
        """Who asked to cancel `job_id`, as recorded; None when unreadable now (the message then names nobody)."""
        try:
            job = await self.store.read(self.store.repo.get, job_id)
        except StoreUnavailable:
            return None
        return None if job is None else job.cancel_requested_by

    def _drop(self, job_id: str) -> None:
        """The job ended in the store while it runs here: stop it without writing anything."""
        entry = self._running.get(job_id)
        if entry is None or entry.task is None or entry.life is RunLife.SETTLING:
            return  # a run writing its outcome learns from that write whether it still held the job
        logger.warning("job %s is no longer held here (it ended or was recovered); stopping it", job_id)
        entry.enter(RunLife.LOST)
        if not entry.ctx.steps_running:
            entry.task.cancel()

    async def _execute(self, entry: RunningJob, record: JobRecord) -> None:
        spec, ctx = entry.spec, entry.ctx
        job_id = record.id
        try:
            if entry.reply_first and not await self._reply_first(entry, record):
                return
            claims = claims_of(record)
            if len(claims) == 1:  # its first claim: how long it waited for a worker
                self.telemetry.duration(
                    "queue_wait", spec.name, (claims[0].claimed_at - record.created_at).total_seconds()
                )
            began = asyncio.get_running_loop().time()
            with self.telemetry.attempt(spec.name, job_id, record.attempts, record.trace_context) as span:
                outcome = await self._run_job(entry, record)
                self.telemetry.duration("run_time", spec.name, asyncio.get_running_loop().time() - began)
                if outcome is not None:
                    await self._settle(entry, job_id, outcome, span)
        except Exception:
            logger.exception("could not record the outcome of job %s (%s)", job_id, spec.name)
        finally:
            for timer in entry.timers:
                timer.cancel()
            ctx._stop_trailing_writes()
            self._running.pop(job_id, None)
            self.slots.release(job_id)
            if self._backlog and not self.closed:
                self._wake.set()  # a slot is free and jobs may be waiting for one

    async def _reply_first(self, entry: RunningJob, record: JobRecord) -> bool:
        """Let the start's reply go first; False when the run was interrupted meanwhile (and settled here)."""
        try:
            for _ in range(REPLY_FIRST_TURNS):
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            if entry.life is RunLife.LOST:
                return False
            if entry.life is RunLife.STOPPING:
                await self._hand_back(record.id)
                return False
            if not entry.ctx.cancelled:
                raise
            await self._settle(entry, record.id, await self._cancelled(record), None)
            return False
        return True

    async def _settle(self, entry: RunningJob, job_id: str, outcome: Outcome, span: Span | None) -> None:
        """Write and count a run's outcome (on `span` too, if any); from here on nothing interrupts the run."""
        entry.enter(RunLife.SETTLING)
        with contextlib.suppress(Exception):
            await entry.ctx.flush()
        status, values = outcome
        reason = ((values.get("error") or {}).get("data") or {}).get("reason")
        if await self._record_outcome(job_id, status, values):
            if entry.settled is not None and not entry.settled.done():
                entry.settled.set_result(outcome)
            self.telemetry.ended(entry.spec.name, status.value, reason)
            if span is not None:
                self.telemetry.outcome(span, status.value, reason)

    def running_by_kind(self) -> dict[str, int]:
        """How many jobs of each kind run here now (the `handles.jobs.running` gauge)."""
        return dict(Counter(entry.spec.name for entry in list(self._running.values())))

    async def _record_outcome(self, job_id: str, status: Status, values: dict[str, Any]) -> bool:
        """Store a job's final state, waiting out an outage while the lease may still be this node's; past
        that, a sweep settles the job. False when not stored, logged with why: the stored state had moved
        on, or the database stayed unavailable."""
        try:
            if await self.store.write(
                job_id, "outcome", self.store.repo.transition, job_id, status, owner=self.owner, **values
            ):
                return True
            logger.info("job %s ended %s here, but its stored state had already moved on", job_id, status)
        except StoreUnavailable:
            logger.error("could not store the outcome of job %s: the database stayed unavailable", job_id)
        return False

    async def _result_of(self, spec: JobSpec, record: JobRecord, value: Any) -> dict[str, Any]:
        """The job's result to store, or a link to its file (a `ResultFile`, or over `link_results_over`)."""
        if isinstance(value, ResultFile):
            file = value
        else:
            # Serialised once: its size, and the text the store writes (`SizedJSON`).
            result = sized_json(result_to_json(spec.to_tool_result(value)))
            if json_size(result) <= (spec.link_results_over or self.config.link_results_over):
                return result
            file = ResultFile.of_result(result, spec.name)
        link = await write_result_file(
            self.store, record.id, file, max_bytes=self.config.max_result_file_bytes
        )
        return linked_result(link, structured=isinstance(value, ResultFile))

    async def _run_job(self, entry: RunningJob, record: JobRecord) -> Outcome | None:
        """Run the job function; return the outcome to store, or None when there is nothing to store here."""
        spec, ctx = entry.spec, entry.ctx
        try:
            try:
                arguments = self.sealer.unseal(record.arguments)
                ctx.redact.add(arguments, spec.sensitive_arguments)
                kwargs = spec.metadata.validate_arguments(arguments)
                kwargs[spec.context_param] = ctx
                if entry.replay is not None:
                    answers, steps = entry.replay
                else:
                    answers, steps = await self.store.read(self.store.repo.replay_state, record.id)
                ctx._replay(answers, steps)
                value = await spec.fn(**kwargs)
            except BaseExceptionGroup as group:  # a TaskGroup of asks, say: parked if every branch parked
                parked, rest = group.split((JobParked, asyncio.CancelledError))
                if parked is not None and rest is None and group.subgroup(JobParked) is not None:
                    raise JobParked("") from None
                raise
            try:
                result = await self._result_of(spec, record, value)
            except ResultTooLarge as exc:
                return failed(f"{exc} It was not stored.", "result_too_large")
            return Status.COMPLETED, {"result": result, "status_message": "Completed."}
        except JobParked:
            entry.enter(RunLife.SETTLING)  # parking is writing its outcome: not to be interrupted
            await self._park(entry, record)
            return None
        except tool_errors() as exc:
            message = clean_message(ctx.redact(str(exc)), 4000) or "The job reported an error."
            error_result = CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)
            return Status.COMPLETED, {
                "result": result_to_json(error_result),
                "status_message": clean_message(message),
            }
        except JobFailed as exc:
            return failed(clean_message(ctx.redact(exc.message)) or "The job failed.", "job_failed")
        except SealedValueUnreadable as exc:
            return failed(str(exc), "sealed_value_unreadable")
        except StepOutcomeUnknown as exc:
            return failed(str(exc), "step_unknown", step=exc.step)
        except UndeclaredAsk as exc:
            reference = secrets.token_hex(6)
            logger.error("job %s (%s) cannot run [reference %s]: %s", record.id, spec.name, reference, exc)
            return failed(
                "The job cannot run because of this server's configuration, not because of your request: it "
                "asks a question, but the server does not take answers for it. Starting it again fails the "
                f"same way until the server's operator fixes it (reference {reference}).",
                "server_configuration",
                reference=reference,
            )
        except LeaseLost:
            logger.info("job %s ended elsewhere while it ran here; dropping this run", record.id)
            return None
        except StoreUnavailable:
            # The job could not record what it did. Leave it to its lease: once the lease runs
            # out, a sweep settles it by its interrupt policy (retry, or fail as interrupted).
            logger.warning("job %s stopped: the database became unavailable mid-run", record.id)
            return None
        except asyncio.CancelledError:
            if entry.life is RunLife.LOST:
                return None
            if entry.life is RunLife.STOPPING:
                repo = self.store.repo
                status = await self._write_held(record.id, "changed", repo.settle_interrupted, shutdown=True)
                if status is Status.WORKING:
                    await self.store.announce(record.id)  # another node takes it now
                return None
            if ctx.cancelled:
                return await self._cancelled(record)
            raise
        except Exception as exc:
            reference = secrets.token_hex(6)
            logger.error(
                "job %s (%s) failed [reference %s]:\n%s",
                record.id,
                spec.name,
                reference,
                ctx.redact("".join(traceback.format_exception(exc))),
            )
            return failed(
                "The job failed because of an unexpected error on the server "
                f"(reference {reference}; operators can find details in the server log).",
                "exception",
                reference=reference,
            )

    async def _park(self, entry: RunningJob, record: JobRecord) -> None:
        """The job waits for answers: give back its lease and slot until they arrive."""
        with contextlib.suppress(Exception):
            await entry.ctx.flush()
        status = await self._write_held(record.id, "changed", self.store.repo.park)
        if status is Status.WORKING:  # answered meanwhile: resume it at once, here or elsewhere
            await self._requeued(record.id)
