"""The executor: runs the jobs of one process against a shared store.

It claims queued jobs into slots (`slots.Slots`), holds a lease on each while it
runs (`leases.LeaseKeeper`), and writes every outcome to the store before anyone
is told. A job that asks a question and finds no answer is *parked*: its run ends,
its lease and slot are given back, and once answered it is claimed again (on any
node) and replayed from the top, its answers and completed steps read back from
the store. A cancel or a shutdown never interrupts a durable step that is
executing: the step finishes and is recorded first, or, past a hard limit, is
recorded as outcome-unknown. A stopping node drains: it stops claiming, lets
running jobs finish for `drain_seconds`, then hands the rest over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import sys
import traceback
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent

from handles.ask_first import FIRST_KEY
from handles.config import HandlesConfig
from handles.errors import JobFailed, LeaseLost, StepOutcomeUnknown, StoreUnavailable
from handles.jobs import JobContext, JobParked, JobSpec, UndeclaredAsk
from handles.limits import clean_message, json_size, sized_json
from handles.outcomes import (
    Outcome,
    cancelled_at_request,
    cancelled_with_unknown_steps,
    failed,
    result_to_json,
)
from handles.results import ResultFile, ResultLink, linked_result
from handles.runtime.leases import LeaseKeeper, every
from handles.runtime.result_files import ResultTooLarge, write_result_file
from handles.runtime.slots import Slots
from handles.runtime.sweeper import Sweeper
from handles.sealing import SealedValueUnreadable, Sealer
from handles.states import Status
from handles.store import Change, JobRecord, Store
from handles.store.models import claims_of, principal_key
from handles.telemetry import Telemetry

if TYPE_CHECKING:
    from opentelemetry.trace import Span

logger = logging.getLogger("handles.runtime")

REPLY_FIRST_TURNS = 8
"""How many turns of the event loop a job started by a request of this process waits before its first step,
so that the request's reply, already on its way out, is sent first (docs/performance.md shows what the
order buys a start). A turn is short when the loop has nothing else to do."""


def tool_errors() -> tuple[type[Exception], ...]:
    """What a job raises to end `completed` with a tool-level error: the SDK's `ToolError`, and FastMCP's.

    The same exception a tool raises for a failure it saw coming. FastMCP's counts once FastMCP is loaded.
    """
    fastmcp = sys.modules.get("fastmcp.exceptions")
    return (ToolError,) if fastmcp is None else (ToolError, fastmcp.ToolError)


class RunLife(Enum):
    """Where a run of this process stands. It only moves forward, in the order written here
    (`_Running.enter`): a stop or a loss may still be followed by the outcome's write, and nothing follows
    that."""

    RUNNING = "running"
    STOPPING = "stopping"
    """Interrupted by this node's shutdown: the job is handed over by its interrupt policy."""
    LOST = "lost"
    """It ended elsewhere (or was recovered) while it ran here: nothing it writes is taken."""
    SETTLING = "settling"
    """Its outcome (or its parking) is being written: nothing interrupts it any more."""


_NEXT_LIVES: dict[RunLife, frozenset[RunLife]] = {
    RunLife.RUNNING: frozenset({RunLife.STOPPING, RunLife.LOST, RunLife.SETTLING}),
    RunLife.STOPPING: frozenset({RunLife.LOST, RunLife.SETTLING}),
    RunLife.LOST: frozenset({RunLife.SETTLING}),
    RunLife.SETTLING: frozenset(),
}


@dataclass
class _Running:
    spec: JobSpec
    ctx: JobContext
    task: asyncio.Task[None] | None = None
    life: RunLife = RunLife.RUNNING
    timers: list[asyncio.TimerHandle] = field(default_factory=list)
    # What the run replays (answers by key, steps by name) when known without reading the store:
    # a job stored a moment ago by this process has no steps, and only the answers it was stored with.
    replay: tuple[dict[str, dict[str, Any]], dict[str, Any]] | None = None
    # Started by a request of this process, whose reply is on its way out: the run lets it go first.
    reply_first: bool = False
    # Started by a request of this process that waits for the job's result (a plain call): the outcome
    # this run stores is set on it once committed, so that request needs no read of it.
    settled: asyncio.Future[Outcome] | None = None

    def enter(self, life: RunLife) -> bool:
        """Move the run to `life` if it may go there from where it stands; whether it did."""
        if life not in _NEXT_LIVES[self.life]:
            return False
        self.life = life
        return True


class Runtime:
    """Runs the jobs of one process against a shared store."""

    def __init__(
        self, *, store: Store, config: HandlesConfig, specs: Mapping[str, JobSpec], sealer: Sealer
    ) -> None:
        self.store = store
        self.sealer = sealer
        self.telemetry = Telemetry()
        self.config = config
        self.specs = specs
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.slots = Slots(config.max_running if config.run_workers else 0, config.principal_slot_limit)
        self._running: dict[str, _Running] = {}
        self._loops: list[asyncio.Task[None]] = []
        self._dispatcher: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._wake = asyncio.Event()
        # Whether queued jobs may be waiting: the dispatcher looks at once only then (and on its timer),
        # and a start is claimed at insert only when nothing waits before it.
        self._backlog = True
        self._leases = LeaseKeeper(
            store=store,
            owner=self.owner,
            config=config,
            held=self.running_ids,
            on_cancel=self.signal_cancel,
            on_lost=self._drop,
        )
        self._sweeper = Sweeper(
            store=store,
            runs_here=lambda job_id: job_id in self._running,
            drop=self._drop,
            signal_cancel=self.signal_cancel,
            requeued=self._requeued,
            evidence_seconds=lambda: self.config.audit_retention_seconds,
            telemetry=self.telemetry,
        )
        store.origin = self.owner
        store.writable_until = self._leases.writable_until  # what a run knows is written through an outage
        self._started = False
        self._draining = False
        self._closed = False
        self._drain_deadline: float | None = None
        self._drain_cut = asyncio.Event()  # set by `end_drain`: the drain ends now

    def reconfigure(self, config: HandlesConfig) -> None:
        """Take new settings (only before the runtime starts)."""
        self.config = config
        self._leases.config = config
        self.slots = Slots(config.max_running if config.run_workers else 0, config.principal_slot_limit)

    # -- life cycle --------------------------------------------------------

    @property
    def started(self) -> bool:
        return self._started

    @property
    def closed(self) -> bool:
        """True once the runtime began to drain or stopped: it takes no new work and never restarts."""
        return self._draining or self._closed

    def running_ids(self) -> list[str]:
        return list(self._running)

    def free_slots(self) -> int:
        """How many more jobs this process would run right now (0 when it runs no workers)."""
        return 0 if self.closed else self.slots.free

    async def start(self) -> None:
        """Start the background loops on the running event loop (idempotent; never after `stop`)."""
        if self._started or self.closed:
            return
        self._started = True
        self.telemetry.observe(self)
        self._wake = asyncio.Event()
        self._leases.wake = asyncio.Event()
        self._loops = [
            asyncio.create_task(self._sweep_loop(), name="handles-sweeper"),
            asyncio.create_task(
                # never woken early: it runs each store_poll_seconds
                every(asyncio.Event, self.config.store_poll_seconds, self.store.poll_watched, "watch pass"),
                name="handles-watch",
            ),
        ]
        listening = await self.store.change_listener(self._on_remote_change)
        if listening is not None:
            self._loops.append(asyncio.create_task(listening, name="handles-listener"))
        if self.config.run_workers:
            # The first pass runs before any start is taken, so work queued before this node started
            # runs at once, and `_backlog` says truthfully from the first start whether anything waits.
            try:
                await self._claim_queued()
            except Exception:
                logger.exception("first dispatcher pass failed; the dispatcher retries")
            self._dispatcher = asyncio.create_task(self._dispatch_loop(), name="handles-dispatcher")
            self._loops.append(asyncio.create_task(self._leases.run(), name="handles-heartbeat"))

    def begin_drain(self) -> None:
        """Stop taking work now and wake every waiter (long-polls answer at once); running jobs go on.

        Safe to call from a signal handler's callback; `stop` finishes the drain.
        """
        if self._draining:
            return
        self._draining = True
        with contextlib.suppress(RuntimeError):
            loop = asyncio.get_running_loop()
            self._drain_deadline = loop.time() + self.config.drain_seconds
        if self._dispatcher is not None:
            self._dispatcher.cancel()
        self.store.notifier.notify_all()
        if self._running:
            logger.info(
                "draining: %d running job(s) may finish for up to %gs",
                len(self._running),
                self.config.drain_seconds,
            )

    def end_drain(self) -> None:
        """End the drain now (a second shutdown signal, or one after a stdio client has gone): `stop` hands
        the running jobs over at once, as it does when `drain_seconds` have passed, instead of waiting
        for them. Safe to call from a signal handler's callback."""
        self.begin_drain()
        if not self._drain_cut.is_set() and self._running:
            logger.info("drain ended early: %d running job(s) are handed over now", len(self._running))
        self._drain_cut.set()

    async def drained(self) -> None:
        """After `begin_drain`: wait until the running jobs have ended, the drain's deadline has passed, or
        `end_drain` has ended it."""
        loop = asyncio.get_running_loop()
        if self._drain_deadline is None:
            self._drain_deadline = loop.time() + self.config.drain_seconds
        waiting = {entry.task for entry in self._running.values() if entry.task is not None}
        if not waiting or self._drain_cut.is_set():
            return
        cut = asyncio.create_task(self._drain_cut.wait(), name="handles-drain-cut")
        try:
            while waiting and not cut.done() and (left := self._drain_deadline - loop.time()) > 0:
                done, _ = await asyncio.wait(
                    waiting | {cut}, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                waiting -= done
        finally:
            cut.cancel()

    async def stop(self) -> None:
        """Drain: stop claiming, let running jobs finish for `drain_seconds`, then hand the rest over.

        A `retry` job still running is released for any node at once; any other job ends
        `failed`, saying it was interrupted by a shutdown; a job with a cancel request
        ends `cancelled`. Steps that are executing are waited for, up to
        `step_cancel_limit_seconds`. Parked jobs are untouched: they hold nothing here.
        """
        if not self._started:
            self._closed = True
            return
        self.begin_drain()
        loop = asyncio.get_running_loop()
        if self._drain_deadline is None:
            self._drain_deadline = loop.time() + self.config.drain_seconds
        if self._dispatcher is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._dispatcher
        await self._settle_background()
        await self.drained()
        leftover = list(self._running.values())
        for entry in leftover:
            entry.enter(RunLife.STOPPING)
            self._interrupt(entry)
        tasks = [entry.task for entry in leftover if entry.task is not None and not entry.task.done()]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=self.config.step_cancel_limit_seconds + 1.0)
            if late:
                logger.warning(
                    "%d job(s) did not stop in time (a step is still executing); their leases will run out "
                    "and another node settles them",
                    len(late),
                )
        await self._settle_background()
        for loop_task in self._loops:
            loop_task.cancel()
        for loop_task in self._loops:
            with contextlib.suppress(asyncio.CancelledError):
                await loop_task
        self._loops = []
        self._started = False
        self._closed = True
        self.telemetry.forget(self)

    def _spawn(self, coroutine: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run a short background task that `stop` waits for."""
        task = asyncio.create_task(coroutine, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_log_task_failure)
        return task

    async def _settle_background(self) -> None:
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    # -- taking work -------------------------------------------------------

    def reserve(self, kind: str, principal: str) -> bool:
        """Hold a slot for a start stored already claimed by this runtime (see `adopt`).

        Only when nothing waits before it: a start never jumps the queue, and a principal
        at its share of the slots waits its turn like everyone else.
        """
        if self.closed or not self._started or kind not in self.specs or self._backlog:
            return False
        return self.slots.reserve_for(principal_key(principal))

    def unreserve(self) -> None:
        self.slots.unreserve(1)

    def queued_message(self, principal: str) -> str:
        """The status message of a start that `reserve` did not run at once: why it waits, truthfully."""
        if self.closed or not self.config.run_workers or not self._started:
            return "Queued; a worker will pick it up shortly."
        if self.slots.free <= 0:
            return "Queued: every worker is busy; it starts as soon as one is free."
        if self.slots.at_share(principal_key(principal)):
            return (
                "Queued: your running jobs hold your share of this server's workers, so other callers' "
                "jobs go first; it starts as soon as none waits or one of yours ends."
            )
        return "Queued; it starts in turn, after the jobs that were waiting before it."

    def adopt(
        self,
        record: JobRecord,
        answers: dict[str, dict[str, Any]],
        *,
        settled: asyncio.Future[Outcome] | None = None,
    ) -> None:
        """Run a job that was stored already leased to this runtime, in the slot `reserve` held.

        `answers` are the answers it was stored with (by question key): a job that never ran has
        no steps, so its first run needs nothing else from the store. If the runtime began to
        drain while the insert was under way, the job is handed to the queue instead, for any node.
        The start's reply goes out before the job's first step (`_reply_first`), unless the caller waits
        for the job's own result instead (a plain call): then `settled` gets the outcome this run stores,
        once committed (it stays pending when the run stores none here: parked, dropped, handed over).
        """
        if self.closed:
            self.slots.unreserve(1)
            self._spawn(self._hand_back(record.id), name=f"handles-hand-back-{record.id}")
            return
        self.slots.take(record.id, record.principal_key or principal_key(record.principal))
        self._start_task(
            self.specs[record.kind],
            record,
            replay=(answers, {}),
            reply_first=settled is None,
            settled=settled,
        )

    def submit(self, job_id: str) -> None:
        """A job was just stored or became claimable: let the dispatcher take it, fairly, if a slot is free."""
        if not self.config.run_workers or self.closed:
            return
        self._backlog = True
        self._wake.set()

    async def _hand_back(self, job_id: str) -> None:
        repo = self.store.repo
        message = "Queued: its server is shutting down; another server starts it shortly."
        await self.store.write_queued(
            job_id, repo.release, job_id, self.owner, message=message, resuming=True
        )

    async def _requeued(self, job_id: str) -> None:
        self._backlog = True
        self._wake.set()
        await self.store.announce(job_id, queued=True)

    def _start_task(
        self,
        spec: JobSpec,
        record: JobRecord,
        replay: tuple[dict[str, dict[str, Any]], dict[str, Any]] | None = None,
        *,
        reply_first: bool = False,
        settled: asyncio.Future[Outcome] | None = None,
    ) -> None:
        ctx = JobContext(
            spec=spec,
            job_id=record.id,
            principal=record.principal,
            attempt=record.attempts,
            owner=self.owner,
            store=self.store,
            progress_flush_seconds=self.config.progress_flush_seconds,
            sealer=self.sealer,
        )
        entry = _Running(spec=spec, ctx=ctx, replay=replay, reply_first=reply_first, settled=settled)
        self._running[record.id] = entry
        self._leases.leased(record.id)
        entry.task = asyncio.create_task(self._execute(entry, record), name=f"handles-job-{spec.name}")

    async def _dispatch_loop(self) -> None:
        await every(lambda: self._wake, self.config.store_poll_seconds, self._claim_queued, "dispatcher pass")

    async def _claim_queued(self) -> None:
        """One dispatcher pass. Shielded: a drain that stops the dispatcher mid-claim still runs (and then
        drains) what the claim took, instead of leaving it leased to a node that never started it."""
        if self.closed:
            return
        await asyncio.shield(self._spawn(self._claim_into_slots(), name="handles-claim"))

    async def _claim_into_slots(self) -> None:
        if self.slots.free <= 0:
            return
        # Unless work is known to wait, look before reserving: a claim holds every free slot until it
        # returns, and a start that meets them held is queued (behind nothing, when nothing waits).
        if not self._backlog and not await self.store.read(self.store.repo.has_claimable, list(self.specs)):
            return
        self._backlog = True  # work waits: a start meanwhile queues behind it, as `reserve` says
        wanted = self.slots.reserve(self.slots.free)
        if wanted <= 0:
            return
        claimed: list[JobRecord] = []
        try:
            claimed = await self.store.call(
                self.store.repo.claim_next,
                self.owner,
                list(self.specs),
                wanted,
                self.config.lease_seconds,
                held=self.slots.held_by_principal(),
                share_limit=self.slots.principal_limit,
                served=self.slots.served(),
            )
        finally:
            self.slots.unreserve(wanted - len(claimed))
        # Fewer than asked for: nothing else waits right now (until a start, a retry or a notice says so).
        self._backlog = len(claimed) >= wanted
        for record in claimed:
            self.slots.take(record.id, record.principal_key or principal_key(record.principal))
            self.store.notifier.notify(record.id)
            self._start_task(self.specs[record.kind], record)

    # -- running -----------------------------------------------------------

    async def _execute(self, entry: _Running, record: JobRecord) -> None:
        spec, ctx = entry.spec, entry.ctx
        job_id = record.id
        try:
            if entry.reply_first and not await self._reply_first(entry, record):
                return
            claims = claims_of(record)
            if len(claims) == 1:  # its first claim: how long it waited for a worker
                self.telemetry.queue_wait(
                    spec.name, (claims[0].claimed_at - record.created_at).total_seconds()
                )
            began = asyncio.get_running_loop().time()
            with self.telemetry.attempt(spec.name, job_id, record.attempts, record.trace_context) as span:
                outcome = await self._run_job(entry, record)
                self.telemetry.run_time(spec.name, asyncio.get_running_loop().time() - began)
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

    async def _reply_first(self, entry: _Running, record: JobRecord) -> bool:
        """Let the reply of the start that stored this job, on its way out through this event loop, go before
        the job's first step (for a short job, its whole run up to its outcome write): `REPLY_FIRST_TURNS`
        turns of the loop. True to run the job now. False when it was interrupted meanwhile, and dealt with
        here: dropped (it ended elsewhere), handed back to the queue for any node by a stop (it never ran
        here, so no interrupt policy applies: as `adopt` sends back a job it cannot run), or ended
        `cancelled` by a cancel whose grace ran out."""
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

    async def _settle(self, entry: _Running, job_id: str, outcome: Outcome, span: Span | None) -> None:
        """Write a run's outcome (and count it, on the attempt's `span` too when it has one). From here on
        nothing interrupts the run (a cancel, a drain)."""
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
        else:
            logger.info("job %s ended %s here, but its stored state had already moved on", job_id, status)

    def running_by_kind(self) -> dict[str, int]:
        """How many jobs of each kind run here now (the `handles.jobs.running` gauge)."""
        counts: dict[str, int] = {}
        for entry in list(self._running.values()):
            counts[entry.spec.name] = counts.get(entry.spec.name, 0) + 1
        return counts

    async def _record_outcome(self, job_id: str, status: Status, values: dict[str, Any]) -> bool:
        """Store a job's final state, waiting out a database outage while its lease may still be this
        node's (`Store.write_short`; the heartbeat renews the lease meanwhile). Past that, the sweep of
        whichever node sees the database first settles the job."""
        try:
            return await self.store.write_short(
                job_id, self.store.repo.transition, job_id, status, owner=self.owner, **values
            )
        except StoreUnavailable:
            logger.error("could not store the outcome of job %s: the database stayed unavailable", job_id)
            return False

    async def _result_of(self, spec: JobSpec, record: JobRecord, value: Any) -> dict[str, Any]:
        """The result to store: the job's own, or a link to the file it is stored in when it is a
        `ResultFile` or larger than the job's `link_results_over` (see handles.runtime.result_files)."""
        if isinstance(value, ResultFile):
            return linked_result(await self._write_file(record, value), structured=True)
        # Serialised once: its size, and the text the store writes (`SizedJSON`).
        result = sized_json(result_to_json(spec.to_tool_result(value)))
        if json_size(result) > (spec.link_results_over or self.config.link_results_over):
            file = ResultFile.of_result(result, spec.name)
            return linked_result(await self._write_file(record, file), structured=False)
        return result

    async def _write_file(self, record: JobRecord, file: ResultFile) -> ResultLink:
        return await write_result_file(
            self.store,
            record.id,
            file,
            max_bytes=self.config.max_result_file_bytes,
        )

    async def _run_job(self, entry: _Running, record: JobRecord) -> Outcome | None:
        """Run the job function; return the outcome to store, or None when there is nothing to store here."""
        spec, ctx = entry.spec, entry.ctx
        try:
            try:
                arguments = self.sealer.unseal(record.arguments)
                ctx.redact.add(arguments, spec.sensitive_arguments)
                kwargs = spec.call_arguments(arguments)
                kwargs[spec.context_param] = ctx
                if entry.replay is not None:
                    answers, steps = entry.replay
                else:
                    answers, steps = await self.store.read(self.store.repo.replay_state, record.id)
                ctx._replay(answers, steps)
                ctx._first_answer = ctx._answers.get(FIRST_KEY)
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
                status = await self.store.write(
                    record.id, self.store.repo.settle_interrupted, record.id, self.owner, shutdown=True
                )
                if status is Status.WORKING:
                    await self.store.announce(record.id, queued=True)  # another node takes it now
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

    async def _park(self, entry: _Running, record: JobRecord) -> None:
        """The job waits for answers: give back its lease and slot until they arrive."""
        with contextlib.suppress(Exception):
            await entry.ctx.flush()
        status = await self.store.write(record.id, self.store.repo.park, record.id, self.owner)
        if status is Status.WORKING:  # answered meanwhile: resume it at once, here or elsewhere
            await self._requeued(record.id)

    def _on_remote_change(self, job_id: str, change: Change) -> None:
        """Another node changed `job_id`: wake waiters here (those past its reports only if it did more than
        report: `ChangeNotifier`); look for a cancel now if the job runs here, and for work if it was
        queued."""
        self.store.notifier.notify(job_id, change)
        if job_id in self._running:
            self._leases.wake.set()
        elif change == "queued" and not self.closed:
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
        loop = asyncio.get_running_loop()
        entry.timers.append(loop.call_later(self.config.cancel_grace_seconds, self._interrupt, entry))
        return True

    def _interrupt(self, entry: _Running) -> None:
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

    def _steps_overran(self, entry: _Running) -> None:
        """A cancelled job's steps outlived the hard limit: end it now, with those steps outcome-unknown."""
        steps = sorted(entry.ctx.steps_running)
        if not steps or entry.task is None or entry.task.done() or not entry.ctx.cancelled:
            return
        if not entry.enter(RunLife.LOST):  # the run goes on in its thread; nothing it writes is taken any more
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
        await self.store.write(
            job_id, self.store.repo.end_with_unknown_steps, job_id, self.owner, steps, status, **values
        )

    async def _cancelled(self, record: JobRecord) -> Outcome:
        """The outcome of a run interrupted by a cancel: its message says who asked for it."""
        return cancelled_at_request(await self._cancel_requester(record.id), record.principal)

    async def _cancel_requester(self, job_id: str) -> str | None:
        """Who asked to cancel `job_id`, as recorded (None if it cannot be read now: the message then names
        nobody rather than guess)."""
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

    # -- leases and sweeps ---------------------------------------------------------

    async def heartbeat_once(self) -> None:
        await self._leases.beat()

    async def _sweep_loop(self) -> None:
        """A sweep at once, then one every `sweep_interval_seconds`."""
        now = asyncio.Event()
        now.set()
        await every(lambda: now, self.config.sweep_interval_seconds, self.sweep_once, "sweep")

    async def sweep_once(self) -> dict[str, int]:
        """One bounded pass over the store (see `handles.runtime.sweeper`)."""
        return await self._sweeper.sweep_once()


def _log_task_failure(task: asyncio.Task[Any]) -> None:
    if task.cancelled() or task.exception() is None:
        return
    error = task.exception()
    if isinstance(error, StoreUnavailable):  # an outage, not a bug: one line, no traceback
        logger.warning(
            "%s: the database is unavailable, nothing was written; leases and the sweep settle it later",
            task.get_name(),
        )
        return
    logger.error("background task failed", exc_info=error)
