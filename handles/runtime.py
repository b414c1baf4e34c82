"""Running jobs: claims, leases and heartbeats, cancellation, recovery after a crash, and the sweeper.

A runtime claims a queued job with a compare-and-set on the store, holds a lease
on it renewed by a heartbeat, and runs the job function as an asyncio task. A job
whose lease runs out (its process died) is recovered by the next runtime that
sweeps, according to the job's `on_interrupt` policy. Nothing about a job lives
only here: every outcome is written to the store before anyone is told.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from mcp_types import CallToolResult, TextContent

from handles.config import HandlesConfig
from handles.errors import JobFailed, LeaseLost, StepOutcomeUnknown, StoreUnavailable, ToolError
from handles.first import FIRST_KEY
from handles.jobs import JobContext, JobSpec
from handles.limits import MAX_RESULT_BYTES, clean_message, json_size
from handles.states import Status
from handles.store import JobRecord, Store

logger = logging.getLogger("handles.runtime")

INTERNAL_ERROR = -32603
SWEEP_BATCH = 500


def _failed(message: str, reason: str, **data: Any) -> tuple[Status, dict[str, Any]]:
    """A `failed` outcome: the JSON-RPC error object the Tasks face returns, and the status message."""
    message = clean_message(message, 2000) or "The job failed."
    error = {"code": INTERNAL_ERROR, "message": message, "data": {"reason": reason, **data}}
    return Status.FAILED, {"error": error, "status_message": clean_message(message)}


def result_to_json(result: CallToolResult) -> dict[str, Any]:
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


@dataclass
class _Running:
    spec: JobSpec
    ctx: JobContext
    task: asyncio.Task[None] | None = None
    stopping: bool = False
    lost: bool = False
    settling: bool = False  # its outcome is being written: the heartbeat leaves it alone
    hard_cancel: asyncio.TimerHandle | None = None


class Runtime:
    """Runs the jobs of one process against a shared store."""

    def __init__(self, *, store: Store, config: HandlesConfig, specs: Mapping[str, JobSpec]) -> None:
        self.store = store
        self.config = config
        self.specs = specs
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._running: dict[str, _Running] = {}
        self._loops: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        self._check_leases = asyncio.Event()
        self._reserved = 0
        # Whether queued jobs may be waiting: the dispatcher looks at once only then (and on its timer).
        self._backlog = True
        store.origin = self.owner
        self._started = False
        self._stopping = False

    # -- life cycle --------------------------------------------------------

    @property
    def started(self) -> bool:
        return self._started

    def running_ids(self) -> list[str]:
        return list(self._running)

    def free_slots(self) -> int:
        """How many more jobs this process would run right now (0 when it runs no workers)."""
        if not self.config.run_workers:
            return 0
        return self.config.max_running - len(self._running) - self._reserved

    def reserve(self, kind: str) -> bool:
        """Hold a slot for a job about to be stored already claimed by this runtime (see `adopt`)."""
        if self._stopping or not self._started or kind not in self.specs or self.free_slots() <= 0:
            return False
        self._reserved += 1
        return True

    def unreserve(self) -> None:
        self._reserved = max(self._reserved - 1, 0)

    def adopt(self, record: JobRecord) -> None:
        """Run a job that was stored already leased to this runtime, in the slot `reserve` held."""
        self.unreserve()
        self._start_task(self.specs[record.kind], record)

    async def start(self) -> None:
        """Start the background loops on the running event loop (idempotent)."""
        if self._started:
            return
        self._started = True
        self._wake = asyncio.Event()
        self._check_leases = asyncio.Event()
        self._loops = [asyncio.create_task(self._sweep_loop(), name="handles-sweeper")]
        if self.store.repo.dialect == "postgresql":
            from handles.store.listen import ChangeListener

            listener = ChangeListener(self.store.repo.url, self.owner, self._on_remote_change)
            self._loops.append(asyncio.create_task(listener.run(), name="handles-listener"))
        if self.config.run_workers:
            self._loops.append(asyncio.create_task(self._dispatch_loop(), name="handles-dispatcher"))
            self._loops.append(asyncio.create_task(self._heartbeat_loop(), name="handles-heartbeat"))

    async def stop(self) -> None:
        """Stop taking work; interrupt running jobs and settle them by their `on_interrupt` policy."""
        if not self._started:
            return
        self._stopping = True
        for loop_task in self._loops:
            loop_task.cancel()
        for loop_task in self._loops:
            with contextlib.suppress(asyncio.CancelledError):
                await loop_task
        running = list(self._running.values())
        for entry in running:
            entry.stopping = True
            if entry.task is not None:
                entry.task.cancel()
        for entry in running:
            if entry.task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await entry.task
        self._started = False
        self._stopping = False

    # -- taking work -------------------------------------------------------

    def submit(self, job_id: str) -> None:
        """A job was just stored: claim and start it now if a slot is free, else let the dispatcher queue it."""
        if not self.config.run_workers or self._stopping:
            return
        if self.free_slots() > 0:
            task = asyncio.create_task(self._claim_and_run(job_id))
            task.add_done_callback(_log_task_failure)
        else:
            self._backlog = True
            self._wake.set()

    async def _claim_and_run(self, job_id: str) -> bool:
        if self.free_slots() <= 0 or job_id in self._running:
            return False
        record = await self.store.write(
            job_id, self.store.repo.claim, job_id, self.owner, self.config.lease_seconds
        )
        if record is None:
            return False
        spec = self.specs.get(record.kind)
        if spec is None:  # a kind this process does not serve; hand it back.
            await self.store.write(
                job_id,
                self.store.repo.release,
                job_id,
                self.owner,
                run_after=self.store.repo.clock(),
                message=None,
            )
            return False
        self._start_task(spec, record)
        return True

    def _start_task(self, spec: JobSpec, record: JobRecord) -> None:
        ctx = JobContext(
            spec=spec,
            job_id=record.id,
            principal=record.principal,
            attempt=record.attempts,
            owner=self.owner,
            store=self.store,
            store_poll_seconds=self.config.store_poll_seconds,
            progress_flush_seconds=self.config.progress_flush_seconds,
        )
        entry = _Running(spec=spec, ctx=ctx)
        self._running[record.id] = entry
        entry.task = asyncio.create_task(self._execute(entry, record), name=f"handles-job-{spec.name}")

    async def _dispatch_loop(self) -> None:
        while True:
            # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancel that lands as the event
            # is set, and stop() would then wait for this loop forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.store_poll_seconds):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self._claim_queued()
            except Exception:
                logger.exception("dispatcher pass failed; retrying")

    async def _claim_queued(self) -> None:
        free = self.free_slots()
        if free <= 0 or self._stopping:
            return
        repo = self.store.repo
        claimed = await self.store.call(
            repo.claim_next, self.owner, list(self.specs), free, self.config.lease_seconds
        )
        # Fewer than asked for: nothing else waits right now (until a start, a retry or a notice says so).
        self._backlog = len(claimed) >= free
        for record in claimed:
            self.store.notifier.notify(record.id)
            self._start_task(self.specs[record.kind], record)

    # -- running -----------------------------------------------------------

    async def _execute(self, entry: _Running, record: JobRecord) -> None:
        spec, ctx = entry.spec, entry.ctx
        job_id = record.id
        try:
            outcome = await self._run_job(entry, record)
            if outcome is not None:
                with contextlib.suppress(Exception):
                    await ctx.flush()
                status, values = outcome
                entry.settling = True
                if not await self._record_outcome(job_id, status, values):
                    logger.info(
                        "job %s ended %s here, but its stored state had already moved on", job_id, status
                    )
        except Exception:
            logger.exception("could not record the outcome of job %s (%s)", job_id, spec.name)
        finally:
            if entry.hard_cancel is not None:
                entry.hard_cancel.cancel()
            self._running.pop(job_id, None)
            if self._backlog:
                self._wake.set()  # a slot is free and jobs may be waiting for one

    async def _record_outcome(self, job_id: str, status: Status, values: dict[str, Any]) -> bool:
        """Store a job's final state, waiting out a database outage for up to two lease periods.

        Past that, the lease has run out and the sweep of whichever node sees the
        database first settles the job by its interrupt policy.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(2 * self.config.lease_seconds, 10.0)
        delay = 0.2
        while True:
            try:
                return await self.store.write(
                    job_id, self.store.repo.transition, job_id, status, owner=self.owner, **values
                )
            except StoreUnavailable:
                if loop.time() + delay > deadline:
                    logger.error(
                        "could not store the outcome of job %s: the database stayed unavailable", job_id
                    )
                    return False
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _run_job(self, entry: _Running, record: JobRecord) -> tuple[Status, dict[str, Any]] | None:
        """Run the job function; return the outcome to store, or None when there is nothing to store here."""
        spec, ctx = entry.spec, entry.ctx
        try:
            kwargs = spec.call_arguments(record.arguments)
            kwargs[spec.context_param] = ctx
            if spec.ask_first is not None:
                first = await self.store.read(self.store.repo.get_input, record.id, FIRST_KEY)
                ctx._first_answer = first.answer if first is not None else None
            result = result_to_json(spec.to_tool_result(await spec.fn(**kwargs)))
            if json_size(result) > MAX_RESULT_BYTES:
                return _failed(
                    f"The job's result is larger than the {MAX_RESULT_BYTES} byte limit and was not stored.",
                    "result_too_large",
                )
            return Status.COMPLETED, {"result": result, "status_message": "Completed."}
        except ToolError as exc:
            message = clean_message(exc.message, 4000) or "The job reported an error."
            error_result = CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)
            return Status.COMPLETED, {
                "result": result_to_json(error_result),
                "status_message": clean_message(message),
            }
        except JobFailed as exc:
            return _failed(clean_message(exc.message) or "The job failed.", "job_failed")
        except StepOutcomeUnknown as exc:
            return _failed(str(exc), "step_unknown", step=exc.step)
        except LeaseLost:
            logger.info("job %s ended elsewhere while it ran here; dropping this run", record.id)
            return None
        except StoreUnavailable:
            # The job could not record what it did. Leave it to its lease: once the lease runs
            # out, a sweep settles it by its interrupt policy (retry, or fail as interrupted).
            logger.warning("job %s stopped: the database became unavailable mid-run", record.id)
            return None
        except asyncio.CancelledError:
            if entry.stopping:
                await self._apply_interrupt_policy(record, owner=self.owner)
                return None
            if entry.lost:
                return None
            if ctx.cancelled:
                return Status.CANCELLED, {"status_message": "Cancelled at the caller's request."}
            raise
        except Exception as exc:
            reference = secrets.token_hex(6)
            logger.error(
                "job %s (%s) failed [reference %s]:\n%s",
                record.id,
                spec.name,
                reference,
                "".join(traceback.format_exception(exc)),
            )
            return _failed(
                "The job failed because of an unexpected error on the server "
                f"(reference {reference}; operators can find details in the server log).",
                "exception",
                reference=reference,
            )

    async def _apply_interrupt_policy(
        self, record: JobRecord, *, owner: str, lease_expired: bool = False
    ) -> None:
        """The job's process stopped mid-run: retry it (with backoff) or fail it, as its row says."""
        repo = self.store.repo
        attempts = record.attempts
        if record.on_interrupt == "retry" and attempts < record.max_attempts:
            delay = min(2 ** max(attempts - 1, 0), 60)
            message = f"Interrupted during attempt {attempts}; retrying as attempt {attempts + 1} of {record.max_attempts}."
            await self.store.write(
                record.id,
                repo.release,
                record.id,
                owner,
                run_after=repo.clock() + timedelta(seconds=delay),
                message=message,
                lease_expired=lease_expired,
            )
            self._backlog = True
            await self.store.announce(record.id, queued=True)
            return
        status, values = _failed(
            "The job was interrupted: the server process running it stopped before it finished"
            + (f" (after {attempts} attempts)" if attempts > 1 else "")
            + ". Its outcome is unknown; reconcile any external effects before starting it again.",
            "interrupted",
            attempts=attempts,
        )
        await self.store.write(
            record.id, repo.transition, record.id, status, owner=owner, lease_expired=lease_expired, **values
        )

    def _on_remote_change(self, job_id: str, queued: bool) -> None:
        """Another node changed `job_id`: wake waiters here; look for a cancel now if the job runs here,
        and for work if it was queued."""
        self.store.notifier.notify(job_id)
        if job_id in self._running:
            self._check_leases.set()
        elif queued:
            self._backlog = True
            self._wake.set()

    # -- cancellation --------------------------------------------------------

    def signal_cancel(self, job_id: str) -> bool:
        """Tell a job running here that a cancel was requested; interrupt it after the grace period."""
        entry = self._running.get(job_id)
        if entry is None or entry.ctx.cancelled:
            return entry is not None
        entry.ctx._request_cancel()
        self.store.notifier.notify(job_id)
        if entry.task is not None:
            entry.hard_cancel = asyncio.get_running_loop().call_later(
                self.config.cancel_grace_seconds, entry.task.cancel
            )
        return True

    def _drop(self, job_id: str) -> None:
        """The job ended in the store while it runs here: stop it without writing anything."""
        entry = self._running.get(job_id)
        if entry is not None and entry.task is not None:
            entry.lost = True
            entry.task.cancel()

    # -- leases ----------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        interval = max(min(self.config.heartbeat_seconds, self.config.lease_seconds / 3), 0.05)
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):  # not wait_for: see _dispatch_loop
                    await self._check_leases.wait()
            self._check_leases.clear()
            try:
                await self.heartbeat_once()
            except Exception:
                logger.exception("heartbeat failed; retrying")

    async def heartbeat_once(self) -> None:
        ids = [job_id for job_id, entry in self._running.items() if not entry.settling]
        if not ids:
            return
        cancelled, lost = await self.store.call(
            self.store.repo.heartbeat, self.owner, ids, self.config.lease_seconds
        )
        for job_id in cancelled:
            self.signal_cancel(job_id)
        for job_id in lost:
            if job_id in self._running:
                logger.warning(
                    "job %s is no longer held here (it ended or was recovered); stopping it", job_id
                )
                self._drop(job_id)

    # -- sweeping ----------------------------------------------------------------

    async def _sweep_loop(self) -> None:
        while True:
            try:
                await self.sweep_once()
            except Exception:
                logger.exception("sweep failed; retrying")
            await asyncio.sleep(self.config.sweep_interval_seconds)

    async def sweep_once(self) -> dict[str, int]:
        """One bounded pass over the store; safe to run on every node at once.

        Recovers jobs whose lease expired (by their interrupt policy), ends jobs past
        their retention or input timeout, cancels abandoned jobs, and deletes ended
        jobs past retention, at most `SWEEP_BATCH` of each.
        """
        repo = self.store.repo
        counts = {"recovered": 0, "timed_out": 0, "abandoned": 0, "deleted": 0}
        for record in await self.store.call(repo.expired_leases, SWEEP_BATCH):
            if record.id in self._running or record.lease_owner is None:
                continue
            await self._apply_interrupt_policy(record, owner=record.lease_owner, lease_expired=True)
            counts["recovered"] += 1
        overdue = await self.store.call(repo.overdue, SWEEP_BATCH)
        for record in overdue["ttl"]:
            status, values = _failed(
                "The job ran longer than its retention allows and was stopped; its handle has expired.", "ttl"
            )
            if await self.store.write(record.id, repo.transition, record.id, status, **values):
                self._drop(record.id)
                counts["timed_out"] += 1
        for record in overdue["input"]:
            status, values = _failed(
                "No answer to the job's question arrived in time, so the job ended without it. "
                "Start a new job and answer within the time limit.",
                "input_timeout",
            )
            if await self.store.write(record.id, repo.transition, record.id, status, **values):
                self._drop(record.id)
                counts["timed_out"] += 1
        for record in overdue["abandoned"]:
            outcome = await self.store.write(record.id, repo.request_cancel, record.id)
            if outcome is not None:
                self.signal_cancel(record.id)
                counts["abandoned"] += 1
        counts["deleted"] = await self.store.call(repo.delete_expired, SWEEP_BATCH)
        return counts


def _log_task_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("background task failed", exc_info=task.exception())
