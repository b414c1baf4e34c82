"""What a job author touches: the job definition (`JobSpec`) and the `JobContext` a job receives."""

from __future__ import annotations

import ast
import asyncio
import functools
import inspect
import re
import textwrap
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, TypedDict, TypeVar, Unpack, overload

import anyio.to_thread
from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata, func_metadata
from mcp_types import CallToolResult
from pydantic import BaseModel, SecretStr, TypeAdapter, ValidationError
from pydantic_core import to_jsonable_python

from handles.ask_first import FIRST_KEY, AskFirst
from handles.elicitation import elicitation_schema
from handles.errors import ConfigurationError, InvalidArguments, StepOutcomeUnknown, StoreUnavailable
from handles.limits import MAX_RESULT_BYTES, clean_message
from handles.results import ResultFile, ResultLink
from handles.sealing import Redactor, Sealer, sensitive_fields
from handles.telemetry import Telemetry

if TYPE_CHECKING:
    from handles.runtime.job_writes import JobWrites, StepRecord

OnInterrupt = Literal["fail", "retry"]
ModelT = TypeVar("ModelT", bound=BaseModel)

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,54}$")
DEFAULT_RETENTION = timedelta(days=1)
DEFAULT_POLL_AFTER = timedelta(seconds=2)


def describe_duration(delta: timedelta) -> str:
    """A short human phrase for a duration: '1 day', '2 hours', '90 seconds'."""
    seconds = int(delta.total_seconds())
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = seconds // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds} second{'s' if seconds != 1 else ''}"


class JobPolicies(TypedDict, total=False):
    """The options of a job that its `JobSpec` keeps as given: each is the `JobSpec` field of the same
    name, which holds its default and meaning (mypy checks that the two agree, at `JobSpec.from_function`)."""

    retention: timedelta
    poll_after: timedelta
    asks_input: bool
    on_interrupt: OnInterrupt
    max_attempts: int
    keep_result_for: timedelta | None
    input_timeout: timedelta | None
    abandon_after: timedelta | None
    ask_first: AskFirst | None
    link_results_over: int | None
    task_after: timedelta | None


class JobOptions(JobPolicies, total=False):
    """Options of `Handles.job`: the policies, and the job's name and description (default: the function's)."""

    name: str | None
    description: str | None


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """One long job: its function, schemas, retention and policies.

    - `retention`: the longest the job lives from its start (its handle expires then);
    - `keep_result_for`: how long a finished job stays fetchable (never beyond `retention`);
    - `input_timeout`: how long `input_required` waits for an answer before the job fails;
    - `abandon_after`: cancel the job when nobody has looked at it for this long;
    - `on_interrupt`: when its process dies, "fail" (default) or "retry" up to `max_attempts`;
    - `ask_first`: a question answered before the job starts (see `handles.ask_first`);
    - `link_results_over`: a result whose JSON is larger than this many bytes is answered as a link;
    - `task_after`: how long a declaring call waits for the job to end before it becomes a task
      (None: at once).
    """

    name: str
    fn: Callable[..., Awaitable[Any]]
    description: str
    context_param: str
    metadata: FuncMetadata
    # The policies (`JobPolicies`), with their defaults:
    retention: timedelta = DEFAULT_RETENTION
    poll_after: timedelta = DEFAULT_POLL_AFTER
    asks_input: bool = False
    on_interrupt: OnInterrupt = "fail"
    max_attempts: int = 3
    keep_result_for: timedelta | None = None
    input_timeout: timedelta | None = None
    abandon_after: timedelta | None = None
    ask_first: AskFirst | None = None
    link_results_over: int | None = None
    task_after: timedelta | None = None

    def __post_init__(self) -> None:
        job = f"Job {self.name!r}"
        if self.retention <= timedelta(0):
            raise ConfigurationError(f"{job}: retention must be positive.")
        if self.on_interrupt not in ("fail", "retry"):
            raise ConfigurationError(f"{job}: on_interrupt must be 'fail' or 'retry'.")
        for label in ("keep_result_for", "input_timeout", "abandon_after", "task_after"):
            value = getattr(self, label)
            if value is not None and value <= timedelta(0):
                raise ConfigurationError(f"{job}: {label} must be positive (or None).")
        if self.ask_first is not None:
            try:
                self.ask_first.requested_schema()
            except ValueError as exc:
                raise ConfigurationError(f"{job}: ask_first: {exc}") from exc
        if self.link_results_over is not None and not 0 < self.link_results_over <= MAX_RESULT_BYTES:
            raise ConfigurationError(
                f"{job}: link_results_over must be between 1 and {MAX_RESULT_BYTES} bytes (or None)."
            )
        # A question asked first makes a job that asks; only a job retried on interrupt runs more than once.
        object.__setattr__(self, "asks_input", self.asks_input or self.ask_first is not None)
        object.__setattr__(
            self, "max_attempts", max(1, self.max_attempts) if self.on_interrupt == "retry" else 1
        )

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Awaitable[Any]],
        *,
        name: str | None = None,
        description: str | None = None,
        **options: Unpack[JobPolicies],
    ) -> JobSpec:
        job_name = name or fn.__name__
        if not _NAME.match(job_name):
            raise ConfigurationError(
                f"Job name {job_name!r} must start with a letter and use only letters, digits and '_' "
                "(at most 55 characters, so that '<name>_progress' stays a valid tool name)."
            )
        if not inspect.iscoroutinefunction(fn):
            raise ConfigurationError(f"Job {job_name!r} must be an `async def` function.")
        context_param = _find_context_param(fn, job_name)
        if not (options.get("asks_input") or options.get("ask_first")) and _calls_ask(fn, context_param):
            raise ConfigurationError(
                f"Job {job_name!r} calls {context_param}.ask() but is not declared to ask: declare it with "
                "@jobs.job(asks_input=True), which gives it the respond tool that takes the answers."
            )
        try:
            metadata = func_metadata(_described(fn), skip_names=[context_param], structured_output=True)
        except Exception as exc:
            raise ConfigurationError(
                f"Job {job_name!r} needs a return annotation that pydantic can describe as JSON "
                f"(a pydantic model, TypedDict, dataclass or primitive): {exc}"
            ) from exc
        return cls(
            name=job_name,
            fn=fn,
            description=inspect.cleandoc(description or fn.__doc__ or f"Runs the {job_name} job."),
            context_param=context_param,
            metadata=metadata,
            **options,
        )

    @property
    def parameters_schema(self) -> dict[str, Any]:
        """JSON Schema of the job's parameters (the start tool's arguments, without `idempotency_key`)."""
        return self.metadata.arg_model.model_json_schema(by_alias=True)

    @functools.cached_property
    def sensitive_arguments(self) -> frozenset[str]:
        """The parameters typed `SecretStr`: sealed in the store, never shown (see handles.sealing).
        Cached: building the schema costs far more than a start."""
        return sensitive_fields(self.parameters_schema)

    @functools.cached_property
    def poll_after_ms(self) -> int:
        """`poll_after` as every face tells callers: whole milliseconds, at least 1 (never "poll again at once")."""
        return max(1, int(self.poll_after.total_seconds() * 1000))

    @property
    def output_schema(self) -> dict[str, Any]:
        """JSON Schema of the job's structured result: what the plain tool would declare."""
        assert self.metadata.output_schema is not None
        return self.metadata.output_schema

    def validate_arguments(self, arguments: dict[str, Any], next_step: str) -> dict[str, Any]:
        """Arguments as JSON-ready values, validated against the job's parameters."""
        try:
            model = self.metadata.arg_model.model_validate(self.metadata.pre_parse_json(arguments))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}" for err in exc.errors()
            )
            raise InvalidArguments(f"Invalid arguments for {self.name}: {problems}.", next_step) from None
        values = model.model_dump(mode="json", by_alias=True)
        for name in self.sensitive_arguments:  # JSON mode masks a SecretStr; the store seals the real value
            secret = getattr(model, name, None)
            if isinstance(secret, SecretStr):
                values[name] = secret.get_secret_value()
        return values

    def to_tool_result(self, value: Any) -> CallToolResult:
        """The `CallToolResult` a plain tool returning `value` would produce."""
        result = self.metadata.convert_result(value)
        assert isinstance(result, CallToolResult)
        return result


def _described(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` as the SDK should describe it: a job returning a `ResultFile` declares a `ResultLink`."""
    signature = inspect.signature(fn, eval_str=True)
    if signature.return_annotation is not ResultFile:
        return fn

    def shim(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError  # only described, never called

    shim.__signature__ = signature.replace(return_annotation=ResultLink)  # type: ignore[attr-defined]
    shim.__name__ = fn.__name__
    shim.__doc__ = fn.__doc__
    return shim


def _calls_ask(fn: Callable[..., Any], context_param: str) -> bool:
    """Whether the job function's own source calls `<context_param>.ask`. A job that asks only through a
    helper is not seen here: it fails when it asks (`UndeclaredAsk`). No source to read: False."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return False
    return any(
        isinstance(node, ast.Attribute)
        and node.attr == "ask"
        and isinstance(node.value, ast.Name)
        and node.value.id == context_param
        for node in ast.walk(tree)
    )


def _find_context_param(fn: Callable[..., Any], job_name: str) -> str:
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:
        raise ConfigurationError(f"Job {job_name!r}: cannot resolve its type hints: {exc}") from exc
    names = [name for name, hint in hints.items() if inspect.isclass(hint) and issubclass(hint, JobContext)]
    if len(names) != 1:
        raise ConfigurationError(
            f"Job {job_name!r} must take exactly one parameter annotated `JobContext` (found {len(names)})."
        )
    return names[0]


class JobParked(BaseException):
    """Raised by `ctx.ask` to park the job; a BaseException, so a job's `except Exception` cannot swallow it."""


class UndeclaredAsk(ConfigurationError):
    """Raised by `ctx.ask` in a job not declared `asks_input=True`: the job fails, its caller is told it is
    the server's configuration, and the server log names the fix."""


class JobContext:
    """The handle a running job has on its own stored state.

    `progress()` reports how far it got (coalesced); `cancelled` tells whether a cancel was requested
    (the job is interrupted after a grace period, never mid-step); `ask()` parks the job until the
    caller answers, then replays it from the top (see docs/durability.md).
    """

    def __init__(
        self,
        *,
        spec: JobSpec,
        job_id: str,
        principal: str,
        attempt: int,
        writes: JobWrites,
        progress_flush_seconds: float,
        sealer: Sealer,
    ) -> None:
        self.spec = spec
        self._sealer = sealer
        self.redact = Redactor()
        """Replaces this job's sensitive values (arguments and answers) in text it writes for others."""
        self.job_id = job_id
        self.principal = principal
        self.attempt = attempt
        self._writes = writes
        self._flush_interval = progress_flush_seconds
        self._cancel_requested = asyncio.Event()
        self._ask_count = 0
        self._latest: tuple[float | None, float | None, str | None] | None = None
        self._dirty = False
        self._last_write = float("-inf")
        self._write_lock = asyncio.Lock()
        self._trailing: asyncio.Task[None] | None = None
        self._step_names: set[str] = set()
        self._answers: dict[str, dict[str, Any]] = {}
        self._completed: dict[str, Any] = {}
        self._running_steps: set[str] = set()
        self._opening = 0  # questions being stored right now (asked together, say with gather)
        self._interrupt_pending = False

    def _replay(self, answers: dict[str, dict[str, Any]], steps: dict[str, StepRecord]) -> None:
        """What earlier runs of this job recorded: answers by key, and steps by name (the runtime's call)."""
        self._answers = {key: self._opened(key, answer) for key, answer in answers.items()}
        self._completed = {name: step.result for name, step in steps.items() if step.status == "completed"}

    def _opened(self, key: str, answer: dict[str, Any]) -> dict[str, Any]:
        """A stored answer with its sealed values opened, and remembered for redaction."""
        opened = self._sealer.unseal(answer)
        self.redact.add(opened, [field for field, value in answer.items() if value != opened.get(field)])
        return opened

    @property
    def steps_running(self) -> frozenset[str]:
        """Names of the durable steps executing right now."""
        return frozenset(self._running_steps)

    def _interrupt_after_steps(self) -> bool:
        """Ask to be interrupted once the running steps are recorded; True the first time."""
        first = not self._interrupt_pending
        self._interrupt_pending = True
        return first

    @property
    def kind(self) -> str:
        return self.spec.name

    @property
    def first_answer(self) -> Any:
        """The answer to the job's `ask_first` question (a model of its schema, or a dict); None without one."""
        answer = self._answers.get(FIRST_KEY)
        if self.spec.ask_first is None or answer is None:
            return None
        schema = self.spec.ask_first.schema
        return answer if isinstance(schema, dict) else _typed(answer, schema)

    @property
    def cancelled(self) -> bool:
        """True once a cancel was requested for this job."""
        return self._cancel_requested.is_set()

    async def checkpoint(self) -> None:
        """Stop here if a cancel was requested (the job then ends `cancelled`)."""
        if self.cancelled:
            raise asyncio.CancelledError("cancel requested")

    async def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Record progress. Writes are coalesced to one per `progress_flush_seconds`; the latest value is kept."""
        self._latest = (
            float(done),
            None if total is None else float(total),
            clean_message(self.redact(message)),
        )
        self._dirty = True
        loop = asyncio.get_running_loop()
        wait = self._last_write + self._flush_interval - loop.time()
        if wait <= 0 and not self._write_lock.locked():
            await self._write_progress()
        elif self._trailing is None or self._trailing.done():
            self._trailing = asyncio.create_task(self._write_later(max(wait, 0.0)))

    async def flush(self) -> None:
        """Write any progress not yet stored (the runtime calls this before the job ends)."""
        self._stop_trailing_writes()
        await self._write_progress()

    def _stop_trailing_writes(self) -> None:
        """The run ended: a delayed progress write still pending is dropped (the outcome supersedes it)."""
        if self._trailing is not None and not self._trailing.done():
            self._trailing.cancel()

    async def _write_later(self, delay: float) -> None:
        await asyncio.sleep(delay)
        await self._write_progress()

    async def _write_progress(self) -> None:
        """Store the latest report in a task of its own, holding the write lock, so an older report never lands last."""
        if self._dirty or self._write_lock.locked():
            await self._writes.to_the_end(self._write_latest())

    async def _write_latest(self) -> None:
        async with self._write_lock:
            if not self._dirty or self._latest is None:
                return
            done, total, message = self._latest
            self._dirty = False
            self._last_write = asyncio.get_running_loop().time()
            try:
                await self._writes.progress(done, total, message)
            except StoreUnavailable:
                # Progress is advisory: keep working, and store the latest value once the database is back.
                self._dirty = True

    @overload
    async def ask(self, message: str, schema: type[ModelT]) -> ModelT: ...

    @overload
    async def ask(self, message: str, schema: dict[str, Any]) -> dict[str, Any]: ...

    async def ask(self, message: str, schema: type[BaseModel] | dict[str, Any]) -> Any:
        """Ask the caller a question and wait for the answer.

        `schema` is a pydantic model of primitive fields (answered as that model) or a form-elicitation
        JSON schema dict (answered as a dict). Without a recorded answer the job is parked (this run ends
        raising `JobParked`, which job code must not catch) and replayed from the top once answered, so code
        before an `ask` must be deterministic and its effects must be in steps. Questions are keyed `q1`, `q2`, ...
        """
        if not self.spec.asks_input:
            raise UndeclaredAsk(
                f"Job {self.spec.name!r} called ctx.ask() but is not declared to ask: declare it with "
                "@jobs.job(asks_input=True), which gives it the respond tool that takes the answers."
            )
        requested = elicitation_schema(schema)
        self._ask_count += 1
        key = f"q{self._ask_count}"
        answer = self._answers.get(key)
        if answer is None:
            answer = await self._open_question(
                key, clean_message(self.redact(message)) or "Input required.", requested
            )
        return answer if isinstance(schema, dict) else _typed(answer, schema)

    async def _open_question(self, key: str, text: str, requested: dict[str, Any]) -> dict[str, Any]:
        """Store the question; return its answer if one is recorded, else park the job (raises `JobParked`)."""
        await self.flush()
        self._opening += 1
        try:
            recorded = await self._writes.open_question(key, text, requested)
        finally:
            self._opening -= 1
        if recorded is not None and recorded.answer is not None:
            return self._opened(key, recorded.answer)
        # Park once every question asked together is stored and no durable step is executing.
        while self._opening or self._running_steps:
            await asyncio.sleep(0.005)
        raise JobParked(key)

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
