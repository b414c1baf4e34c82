"""The operations on stored jobs that every face shares: start, open a handle, wait, cancel, respond."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property, partial
from typing import Any, TypeVar

from handles.answer_checks import checked_answers, unasked_answers
from handles.ask_first import FIRST_KEY
from handles.config import HandlesConfig
from handles.elicitation import validate_answer
from handles.errors import (
    DatabaseUnreachable,
    ExpiredHandle,
    IdempotencyConflict,
    InvalidArguments,
    JobsPaused,
    LimitReached,
    ShuttingDown,
    StoreUnavailable,
    UnknownHandle,
    WrongJobKind,
)
from handles.handle import HandleClaims, HandleCodec, new_job_id
from handles.jobs import JobSpec, describe_duration
from handles.limits import MAX_ARGUMENTS_BYTES, MAX_IDEMPOTENCY_KEY, MAX_RESPONSE_BYTES, check_size
from handles.outcomes import Outcome
from handles.runtime import Runtime
from handles.sealing import Sealer, sensitive_fields, shown
from handles.states import Status
from handles.store import (
    AnswerOutcome,
    CancelOutcome,
    InputRequestRecord,
    JobRecord,
    JobState,
    Started,
    StepState,
    Store,
    run_shielded,
)
from handles.store.models import claim_entry, principal_key
from handles.store.repository import ActiveLimitReached
from handles.store.schema import SchemaGate
from handles.switches import SwitchBoard
from handles.telemetry import start_context


@dataclass(frozen=True)
class JobView:
    """A job's state with its open questions and its durable steps."""

    job: JobState
    pending: list[InputRequestRecord]
    steps: list[StepState]


@dataclass(frozen=True)
class StartedJob:
    job: JobRecord
    created: bool
    mint: Callable[[], str]

    @cached_property
    def handle(self) -> str:
        """The signed handle of `job`, minted on first read: a plain call answered inline never needs one."""
        return self.mint()


@dataclass(frozen=True)
class _NewJob:
    """A start's job row, ready to insert: `claimed` runs it here (in the slot `Runtime.reserve` held),
    `queued` leaves it to any node's dispatcher."""

    record: JobRecord
    question: InputRequestRecord | None
    claimed: bool
    queued: bool
    settled: asyncio.Future[Outcome] | None


Opened = TypeVar("Opened", JobRecord, JobState)
"""A job read whole, or its state alone (`JobRepository.snapshot`)."""

REREAD_SECONDS = 60.0
"""The longest a wait goes between two reads of its job when nothing wakes it."""

UNKNOWN_HANDLE = (
    "This handle is not valid here: it may be mistyped, truncated, made up, signed by a retired key, "
    "or issued to someone else."
)


def arguments_digest(arguments: dict[str, Any], sensitive: frozenset[str]) -> str:
    """What an idempotent start compares: the arguments less the sensitive ones (a short secret's hash is guessable)."""
    compared = {key: value for key, value in arguments.items() if key not in sensitive}
    canonical = json.dumps(compared, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _seconds(delta: timedelta | None) -> float | None:
    return None if delta is None else delta.total_seconds()


@dataclass(kw_only=True, eq=False)
class JobOperations:
    """Start, find and steer stored jobs on behalf of a principal."""

    specs: Mapping[str, JobSpec]
    store: Store
    codec: HandleCodec
    sealer: Sealer
    runtime: Runtime
    config: HandlesConfig
    schema: SchemaGate | None = None

    def __post_init__(self) -> None:
        self.switches = SwitchBoard(self.store, self.config)

    @property
    def clock(self) -> Callable[[], Any]:
        return self.store.repo.clock

    async def ensure_running(self) -> None:
        """Bring the schema current and start the runtime on first use, awaited first by every operation a
        request begins with; refuses (retryably) once the runtime drains, and never restarts it."""
        if self.runtime.closed:
            raise ShuttingDown(
                "This server is shutting down and takes no new calls; nothing was changed.",
                "Retry the same call in a few seconds: another server, or this one once restarted, answers it. "
                "Jobs and handles are kept.",
            )
        if self.schema is not None and not self.schema.is_open:
            try:
                await self.schema.open()
            except DatabaseUnreachable as exc:
                raise StoreUnavailable.now() from exc
        if not self.runtime.started:
            await self.runtime.start()

    # -- the operator's switches ----------------------------------------------

    async def tasks_stopped(self) -> bool:
        """Whether the Tasks face's kill switch is on: a declaring call must not become a task now."""
        await self.ensure_running()
        return (await self.switches.current()).tasks_off is not None

    async def check_accepting(self, spec: JobSpec) -> None:
        """Raise `JobsPaused` (retryable) while an operator pauses new starts of `spec`'s job kind."""
        await self.ensure_running()
        pause = (await self.switches.current()).paused.get(spec.name)
        if pause is not None:
            raise JobsPaused.of(spec.name, pause.retry_after_seconds)

    # -- start -------------------------------------------------------------

    async def start(
        self,
        spec: JobSpec,
        principal: str,
        arguments: dict[str, Any],
        idempotency_key: str | None,
        *,
        first_answer: dict[str, Any] | None = None,
        settled: asyncio.Future[Outcome] | None = None,
        face: str | None = None,
    ) -> StartedJob:
        """Validate, store durably and hand the job to the runtime (refused while its kind is paused). An
        `ask_first` job runs at once given `first_answer`, else waits in `input_required`; `settled` (a plain
        call's) gets the stored outcome (`Runtime.adopt`); `face` labels the started counter."""
        await self.check_accepting(spec)
        retry_hint = f"Fix the arguments and call {spec.name}_start again."
        check_size(arguments, MAX_ARGUMENTS_BYTES, "arguments", retry_hint)
        values = spec.validate_arguments(arguments, retry_hint)
        if idempotency_key is not None and not (
            0 < len(idempotency_key) <= MAX_IDEMPOTENCY_KEY and idempotency_key.isprintable()
        ):
            # Printable only: a NUL cannot even be stored in a PostgreSQL text column.
            raise InvalidArguments(
                f"idempotency_key must be 1 to {MAX_IDEMPOTENCY_KEY} printable characters.",
                "Use a short unique string such as a UUID, or leave it out.",
            )
        now = self.clock()
        question = self._first_question(spec, values, first_answer, now)
        waiting = question is not None and question.answered_at is None
        # Claim at insert: with a free local slot the job is stored already leased to this
        # runtime and starts at once, saving the claim's write transaction.
        claimed = not waiting and self.runtime.reserve(spec.name, principal)
        if waiting:
            assert question is not None
            status_message = question.message
        elif claimed:
            status_message = "Running."
        else:
            status_message = self.runtime.queued_message(principal)
        claim: dict[str, Any] = {}
        if claimed:
            claim = {
                "lease_owner": self.runtime.owner,
                "lease_expires_at": now + timedelta(seconds=self.config.lease_seconds),
                "attempts": 1,
                "started_at": now,
                "claim_log": claim_entry(1, now, self.runtime.owner),
            }
        record = JobRecord.model_construct(
            id=new_job_id(),
            kind=spec.name,
            principal=principal,
            principal_key=principal_key(principal),
            status=(Status.INPUT_REQUIRED if waiting else Status.WORKING).value,
            status_message=status_message,
            arguments=self.sealer.seal(values, spec.sensitive_arguments),
            arguments_digest=arguments_digest(values, spec.sensitive_arguments),
            idempotency_key=idempotency_key,
            created_at=now,
            updated_at=now,
            run_after=now,
            expires_at=now + spec.retention,
            on_interrupt=spec.on_interrupt,
            max_attempts=spec.max_attempts,
            keep_result_seconds=_seconds(spec.keep_result_for),
            input_timeout_seconds=_seconds(spec.input_timeout),
            abandon_after_seconds=_seconds(spec.abandon_after),
            abandon_at=None if spec.abandon_after is None else now + spec.abandon_after,
            trace_context=start_context(),
            input_deadline=None if not waiting or spec.input_timeout is None else now + spec.input_timeout,
            **claim,
        )
        if question is not None:
            question.job_id = record.id
        new = _NewJob(record, question, claimed=claimed, queued=not claimed and not waiting, settled=settled)
        try:
            # On an SQLite file with its writer lock free, the insert runs right here, with no await: nothing
            # can cancel it, so it needs no task of its own (and no turns of the loop to wait for one).
            done = self._store(new)
            if not isinstance(done, tuple):
                # Shielded: once the insert is under way, the job is stored and handed to the runtime (or
                # queued) even if the caller's request is cancelled, so a committed start always runs.
                done = await run_shielded(done)
            elif settled is not None:
                # The caller waits for the job's result: the job's first step (for a short job, its whole
                # run up to its outcome) goes before the start returns, so the caller finds `settled` done
                # instead of waiting for the job and reading it back.
                await asyncio.sleep(0)
            stored, created = done
        except ActiveLimitReached as exc:
            raise LimitReached(
                f"You already have {exc.active} active jobs on this server; the limit is {exc.limit}.",
                "Wait for one of them to finish, or cancel one you no longer need, then start again.",
                data={"limit": exc.limit},
            ) from None
        if not created and stored.arguments_digest != record.arguments_digest:
            raise IdempotencyConflict(
                f"The idempotency_key {idempotency_key!r} was already used to start {spec.name} with "
                "different arguments.",
                "Use a new idempotency_key for a different request, or repeat the original arguments to get "
                "the original job's handle back.",
            )
        if created:
            self.runtime.telemetry.started(spec.name, face)
        return StartedJob(job=stored, created=created, mint=partial(self.handle_of, stored))

    def handle_of(self, job: JobRecord) -> str:
        """The job's handle, signed with its first expiry (creation plus retention), so it never changes."""
        expires_at = job.created_at + self.specs[job.kind].retention
        return self.codec.mint(job_id=job.id, kind=job.kind, principal=job.principal, expires_at=expires_at)

    def _store(self, new: _NewJob) -> Started | Coroutine[Any, Any, Started]:
        """Insert the job and hand it over: at once when the insert ran without an await, else as a coroutine."""
        with self._reservation(new):
            done = self.store.start(
                new.record,
                queued=new.queued,
                active_limit=self.config.max_active_per_principal,
                questions=[new.question] if new.question is not None else [],
                lease_seconds=self.config.lease_seconds,
            )
        if isinstance(done, tuple):
            return self._hand_over(new, *done)
        return self._hand_over_once_stored(new, done)

    async def _hand_over_once_stored(self, new: _NewJob, insert: Awaitable[Started]) -> Started:
        with self._reservation(new):
            done = await insert
        return self._hand_over(new, *done)

    @contextmanager
    def _reservation(self, new: _NewJob) -> Iterator[None]:
        """Give back the slot a start claiming its job reserved (`Runtime.reserve`) if its insert fails."""
        try:
            yield
        except BaseException:
            if new.claimed:
                self.runtime.slots.unreserve()
            raise

    def _hand_over(self, new: _NewJob, stored: JobRecord, created: bool) -> tuple[JobRecord, bool]:
        """After the insert: run the job here (claimed at insert) or queue it for any worker."""
        question = new.question
        if new.claimed and created:
            answers = (
                {question.key: question.answer}
                if question is not None and question.answer is not None
                else {}
            )
            self.runtime.adopt(stored, answers, settled=new.settled)
        elif new.claimed:
            self.runtime.slots.unreserve()
        if created and new.queued:
            self.runtime.submit()  # other nodes heard of it as the insert committed
        return stored, created

    def _first_question(
        self, spec: JobSpec, arguments: dict[str, Any], answer: dict[str, Any] | None, now: Any
    ) -> InputRequestRecord | None:
        """The stored form of the job's `ask_first` question, answered when `answer` is given (checked here)."""
        if spec.ask_first is None:
            return None
        schema = spec.ask_first.requested_schema()
        if answer is not None:
            problems = validate_answer(schema, answer)
            if problems:
                raise InvalidArguments(
                    f"The answer to {FIRST_KEY} does not fit its schema: " + "; ".join(problems) + ".",
                    f"Answer {FIRST_KEY} again with the requested fields; nothing was started.",
                )
        return InputRequestRecord(
            job_id="",
            key=FIRST_KEY,
            message=spec.ask_first.render(shown(arguments) or {}),
            requested_schema=schema,
            created_at=now,
            answered_at=None if answer is None else now,
            answer=None if answer is None else self.sealer.seal(answer, sensitive_fields(schema)),
        )

    # -- handles -----------------------------------------------------------

    async def open(self, spec: JobSpec, principal: str, handle: object) -> JobRecord:
        """The caller's job for `handle`, or a caller error that reveals nothing about other principals."""
        claims = await self._claims(spec, principal, handle)
        record = await self.store.read(self.store.repo.get, claims.job_id)
        return await self._owned(spec, principal, record)

    async def open_view(self, spec: JobSpec, principal: str, handle: object) -> JobView:
        """Like `open`, with the job's open questions and steps, read together in one go."""
        claims = await self._claims(spec, principal, handle)
        record, pending, steps = await self.store.read(self.store.repo.snapshot, claims.job_id)
        return JobView(await self._owned(spec, principal, record), pending, steps)

    async def view(self, record: JobRecord | JobState) -> JobView:
        """The latest state of a job already opened, with its open questions and steps."""
        latest, pending, steps = await self.store.read(self.store.repo.snapshot, record.id)
        return JobView(latest or JobState.of(record), pending, steps)

    async def _claims(self, spec: JobSpec, principal: str, handle: object) -> HandleClaims:
        """Signature, principal, job kind and expiry of `handle`, all checked before the store is read."""
        await self.ensure_running()
        claims = self.codec.verify(handle, principal=principal)
        if claims is None:
            raise self.unknown_handle(spec)
        if claims.kind != spec.name:
            raise WrongJobKind(
                f"This handle belongs to a {claims.kind} job, not to {spec.name}.",
                f"Use the {claims.kind}_progress, {claims.kind}_fetch or {claims.kind}_cancel tools with it.",
            )
        if claims.expires_at <= self.clock():
            raise self.expired_handle(spec, claims.expires_at)
        return claims

    async def _owned(self, spec: JobSpec, principal: str, record: Opened | None) -> Opened:
        if record is None:
            raise self.expired_handle(spec)
        if record.principal != principal or record.kind != spec.name:
            raise self.unknown_handle(spec)
        await self._keep_alive(record)
        return record

    async def _keep_alive(self, record: JobRecord | JobState) -> None:
        """Someone is following the job: push back its abandonment deadline (at most a few writes per period)."""
        if record.abandon_after_seconds is None or record.abandon_at is None:
            return
        remaining = (record.abandon_at - self.clock()).total_seconds()
        if remaining < record.abandon_after_seconds * 0.75:
            await self.store.call(self.store.repo.touch_abandon_deadline, record.id)

    async def open_any(self, principal: str, handle: object) -> tuple[JobSpec, JobRecord]:
        """The caller's job for a handle of any declared kind (the Tasks face has no tool name to go by)."""
        spec = await self.spec_of(principal, handle)
        return spec, await self.open(spec, principal, handle)

    async def spec_of(self, principal: str, handle: object) -> JobSpec:
        """The declared job a genuine handle of `principal` belongs to; else the refusal naming every start tool."""
        await self.ensure_running()
        claims = self.codec.verify(handle, principal=principal)
        spec = self.specs.get(claims.kind) if claims is not None else None
        if spec is None:
            raise self.unknown_handle(*self.specs.values())
        return spec

    def unknown_handle(self, *specs: JobSpec) -> UnknownHandle:
        """The refusal of a handle that is not a genuine one of the caller's, pointing to the start tools of `specs`."""
        starts = " or ".join(f"{spec.name}_start" for spec in specs)
        return UnknownHandle(
            UNKNOWN_HANDLE,
            f"Pass the exact handle string that a start tool returned, or start a new job with {starts}.",
        )

    def expired_handle(self, spec: JobSpec, expired_at: datetime | None = None) -> ExpiredHandle:
        """The refusal of a genuine handle whose job expired at `expired_at`, or (None) was deleted."""
        kept = f"{spec.name} jobs are kept for {describe_duration(spec.retention)}"
        if spec.keep_result_for is not None:
            kept += f", and their results for {describe_duration(spec.keep_result_for)} after they end"
        detail = (
            f"expired at {expired_at.isoformat()}"
            if expired_at is not None
            else "no longer exists: it was deleted (retention ended, or an operator purged it)"
        )
        return ExpiredHandle(
            f"This {spec.name} job {detail}; {kept}.",
            f"Start a new job with {spec.name}_start if you still need the result.",
        )

    # -- waiting -----------------------------------------------------------

    async def versions(
        self,
        record: Opened,
        seconds: float | None = None,
        *,
        past_reports: bool = False,
        outage_pause: float | None = None,
    ) -> AsyncGenerator[Opened | JobRecord]:
        """`record`, then each newer version of its job, stored here or on any node, until it ends or is gone,
        `seconds` pass or the node drains: the one way a face waits for a job. A store outage pauses the reads
        `outage_pause` long (None: raises). Between two reads it always awaits, so no caller spins on reads."""
        yield record
        loop = asyncio.get_running_loop()
        deadline = None if seconds is None else loop.time() + seconds
        store, notifier, job_id = self.store, self.store.notifier, record.id
        last: Opened | JobRecord = record
        # Draining is checked after each read, not before: the answer a drain cuts short is the latest state.
        while not Status(last.status).is_terminal and (deadline is None or loop.time() < deadline):
            # Watch, then read: a change landing after the read still ends the wait below at once.
            changed = notifier.watch(job_id, past_reports=past_reports)
            try:
                latest = await store.read(store.repo.get, job_id)
            except StoreUnavailable:
                if outage_pause is None:
                    raise
                if self.runtime.closed:
                    return
                await asyncio.sleep(outage_pause)
                continue
            if latest is None:
                return
            if latest.version != last.version:
                last = latest
                yield latest
            if Status(last.status).is_terminal or self.runtime.closed:
                return
            timeout = REREAD_SECONDS if deadline is None else min(REREAD_SECONDS, deadline - loop.time())
            if timeout <= 0:
                return
            notifier.seen(job_id, last.version)
            if changed.is_set():
                await asyncio.sleep(0)  # changed since the read: read it again, after one turn of the loop
            else:
                await notifier.wait(job_id, timeout, event=changed)

    async def wait(
        self,
        record: Opened,
        wait_seconds: float,
        until: Callable[[Opened | JobRecord], bool],
        *,
        past_reports: bool = False,
    ) -> Opened | JobRecord:
        """Re-read the job until `until(job)` holds or `wait_seconds` (capped) pass; returns the latest state.
        `past_reports`: not woken by progress and step reports, which `until` does not read."""
        if wait_seconds <= 0 or until(record):
            return record
        latest: Opened | JobRecord = record
        seconds = min(wait_seconds, self.config.max_wait_seconds)
        async with contextlib.aclosing(self.versions(record, seconds, past_reports=past_reports)) as versions:
            async for latest in versions:
                if until(latest):
                    break
        return latest

    async def pending_inputs(self, record: JobRecord) -> list[InputRequestRecord]:
        if Status(record.status) is not Status.INPUT_REQUIRED:
            return []
        return await self.store.read(self.store.repo.pending_inputs, record.id)

    # -- steering ------------------------------------------------------------

    async def cancel(self, record: JobRecord) -> JobRecord:
        """Request cancellation: durable first, then the running job is signalled."""
        outcome = await request_cancel(self.store, self.runtime, record, record.principal)
        return record if outcome is None else outcome.job

    async def respond(
        self,
        spec: JobSpec,
        record: JobRecord,
        responses: dict[str, Any],
        *,
        again: str | None = None,
        follow: str | None = None,
    ) -> AnswerOutcome:
        """Check every answer against its question's schema, then store them all or none; a reply naming no
        question the job asked is refused. `again` and `follow` name the tools a refusal points to."""
        check_size(
            responses,
            MAX_RESPONSE_BYTES,
            "responses",
            "Send each answer as an object of the requested fields, in valid Unicode and within the size limit.",
        )
        again = again or f"{spec.name}_respond"
        pending = {r.key: r for r in await self.store.read(self.store.repo.pending_inputs, record.id)}
        if not pending.keys() & responses.keys():
            asked = {r.key for r in await self.store.read(self.store.repo.questions, record.id)}
            if not asked & responses.keys():
                raise unasked_answers(
                    responses,
                    list(pending) if record.status == Status.INPUT_REQUIRED else [],
                    status=record.status,
                    again=again,
                    follow=follow or f"{spec.name}_progress",
                )
        sealed = checked_answers(self.sealer, pending, responses, f"call {again} again")
        outcome = await store_answers(self.store, self.runtime, record, pending, sealed, record.principal)
        if outcome is None:
            raise self.expired_handle(spec)
        return outcome


async def request_cancel(
    store: Store, runtime: Runtime | None, job: JobRecord, by: str
) -> CancelOutcome | None:
    """Request `job`'s cancellation as `by`, durable first; this node's run of it, if any, is then signalled."""
    outcome = await store.write(job.id, "changed", store.repo.request_cancel, job.id, by)
    if outcome is not None and runtime is not None:
        if outcome.ended_now:
            runtime.telemetry.ended(job.kind, Status.CANCELLED.value)
        elif not Status(outcome.job.status).is_terminal:
            runtime.signal_cancel(job.id)
    return outcome


async def store_answers(
    store: Store,
    runtime: Runtime | None,
    job: JobRecord,
    pending: Mapping[str, InputRequestRecord],
    sealed: dict[str, Any],
    by: str,
) -> AnswerOutcome | None:
    """Store checked answers to `pending` questions as `by`; a job they let go on is queued for any node."""
    outcome = await store.write(job.id, "changed", store.repo.answer_inputs, job.id, sealed, by)
    if outcome is None:
        return None
    if runtime is not None:
        now = store.repo.clock()
        for key in outcome.accepted:
            runtime.telemetry.duration(
                "parked_time", job.kind, (now - pending[key].created_at).total_seconds()
            )
    if outcome.job.status == Status.WORKING and outcome.job.lease_owner is None:
        # parked, or its question before the start answered: a worker on any node may take it now
        if runtime is not None:
            runtime.submit()
        await store.announce(job.id)
    return outcome
