"""Section 16: the start handler by parts, on an SQLite file and on PostgreSQL.

Section 2 times the start handler (`JobTools.start`) whole, beside its floor: the same job row inserted
durably by the database driver alone. This section runs section 2's loop (a start of a 0 s job, the
job awaited, the floor, a no-op MCP call) with each part of the start wrapped in a timer for the run
(`time.perf_counter`, put back afterwards), so the difference between the handler and its floor is
split into the parts that make it: what the database runs, what the store's Python does around it,
the task around the insert (PostgreSQL), the arguments' checks, the job's row, the hand-over to the runtime,
the handle and the reply.

Each timer costs about a microsecond, which a part's row includes (and its enclosing parts' rows with
it). The rows are p50s of each part alone, so they do not add up exactly; the derived rows subtract two
p50s of the same starts.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from bench.common import Options, Table, inprocess, log, sqlite_and_postgres, structured, timed
from bench.durable import DriverInsert

SECTION = "start_parts"
PRINCIPAL = "local:local"

# (key, depth, what the row says): a part timed by a wrapper, or derived from two of them; a row of depth d
# is inside the row of depth d - 1 above it.
PARTS = (
    ("untimed", 0, "the start handler with no timer in it (`JobTools.start`, as section 2 times it)"),
    ("floor", 0, "floor: the same job row inserted durably by the driver alone (section 2's)"),
    ("beyond_floor", 0, "derived: the untimed handler - the floor (what the package adds)"),
    ("handler", 0, "the start handler with its parts timed (below; the difference is the timers' own cost)"),
    ("operations", 1, "`JobOperations.start`: all but the handle and the reply"),
    ("check_accepting", 2, "the operator's pause switch (`check_accepting`)"),
    ("check_size", 2, "the arguments' size (`check_size`)"),
    ("validate", 2, "the arguments' validation (`JobSpec.validate_arguments`)"),
    ("digest", 2, "the arguments' digest (`arguments_digest`)"),
    (
        "stored",
        2,
        "the insert as the start awaits it (SQLite: `Store.start`; PostgreSQL: its shielded task)",
    ),
    ("insert", 3, "`JobRepository.insert` (PostgreSQL: `start_on_loop`, awaited on the event loop)"),
    (
        "database",
        4,
        "the database's part (SQLite: the write transaction; PostgreSQL: the call of `handles_start`)",
    ),
    ("bind", 5, "the row's values bound (`_Prepared.parameters`)"),
    ("count", 5, "SQLite: the principal's active count (`SELECT count(*)`)"),
    ("insert_statement", 5, "SQLite: the `INSERT`"),
    ("store_python", 4, "derived: the store's Python around it (`insert` - the database's part)"),
    ("pool", 5, "PostgreSQL: the loop's connection taken and given back (`LoopConnections.connection`)"),
    (
        "hop",
        3,
        "derived: PostgreSQL: the shielded task and the store's call around the insert (the task - `insert` - "
        "the hand-over); SQLite: the store's call around the insert on the event loop (`Store.start` - `insert`)",
    ),
    ("hand_over", 3, "the hand-over to the runtime (`_hand_over`: the job's task made)"),
    ("reply", 1, "derived: the handle and the reply (the handler - `JobOperations.start`)"),
    ("mint", 2, "the handle signed (`HandleCodec.mint`)"),
)


@contextlib.contextmanager
def _patched(owner: Any, name: str, replacement: Any) -> Iterator[None]:
    """`owner.name` replaced for the block (a class's own attribute, a module's, or an instance's), then put
    back as it was."""
    own = vars(owner)
    had, original = name in own, own.get(name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        if had:
            setattr(owner, name, original)
        else:
            delattr(owner, name)


def _timed_call(fn: Callable[..., Any], samples: list[float]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            samples.append(time.perf_counter() - began)

    return call


def _timed_await(fn: Callable[..., Any], samples: list[float]) -> Callable[..., Any]:
    async def call(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return await fn(*args, **kwargs)
        finally:
            samples.append(time.perf_counter() - began)

    return call


class _TimedStatements:
    """A DB-API connection whose `execute` is timed by statement: `count` for the active count,
    `insert_statement` for the INSERT."""

    def __init__(self, connection: Any, samples: dict[str, list[float]]) -> None:
        self._connection = connection
        self._samples = samples

    def execute(self, sql: str, *args: Any) -> Any:
        began = time.perf_counter()
        try:
            return self._connection.execute(sql, *args)
        finally:
            key = "count" if "count(" in sql else "insert_statement" if sql.startswith("INSERT") else None
            if key is not None:
                self._samples[key].append(time.perf_counter() - began)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)


class _TimedExecute:
    """A connection whose `execute` (a statement's round trip) is timed into `samples`."""

    def __init__(self, connection: Any, samples: list[float]) -> None:
        self._connection, self._samples = connection, samples

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)

    async def execute(self, *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return await self._connection.execute(*args, **kwargs)
        finally:
            self._samples.append(time.perf_counter() - began)


def _timed_around_async(
    fn: Callable[..., Any], samples: list[float], when: Callable[[], bool], executes: list[float]
) -> Callable[..., Any]:
    """An asynchronous context manager factory of connections, timed at its entry and its exit (its block not
    counted), and its connection's statements timed into `executes`, when `when()` says so at its entry (a
    start's insert)."""

    @contextlib.asynccontextmanager
    async def block(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        timing = when()
        began = time.perf_counter()
        async with fn(*args, **kwargs) as value:
            entered = time.perf_counter() - began
            yield _TimedExecute(value, executes) if timing else value
            leaving = time.perf_counter()
        if timing:
            samples.append(entered + time.perf_counter() - leaving)

    return block


def _timed_transaction(
    fn: Callable[..., Any], samples: dict[str, list[float]], when: Callable[[], bool]
) -> Callable[..., Any]:
    """SQLite's `_sqlite_writing`, timed from its entry to its exit (`database`) and by statement, when
    `when()` says so at its entry (a start's insert, not a job's outcome)."""

    @contextlib.contextmanager
    def block(*args: Any, **kwargs: Any) -> Iterator[Any]:
        if not when():
            with fn(*args, **kwargs) as connection:
                yield connection
            return
        began = time.perf_counter()
        try:
            with fn(*args, **kwargs) as connection:
                yield _TimedStatements(connection, samples)
        finally:
            samples["database"].append(time.perf_counter() - began)

    return block


@contextlib.contextmanager
def _timers(jobs: Any, samples: dict[str, list[float]]) -> Iterator[None]:
    import handles.job_operations as operations_module
    from handles.handle import HandleCodec
    from handles.job_operations import JobOperations
    from handles.server.handle_tools import JobTools
    from handles.store import Store
    from handles.store.repository import JobRepository
    from handles.store.statements import _START

    service = jobs.service
    repo = service.store.repo
    spec_type = type(jobs.specs["work"])
    postgres = not repo.sqlite
    s = samples
    with contextlib.ExitStack() as stack:
        patch = stack.enter_context

        def method(owner: type, name: str, key: str, wrap: Callable[..., Any]) -> None:
            patch(_patched(owner, name, wrap(owner.__dict__[name], s[key])))

        method(JobTools, "start", "handler", _timed_await)
        method(JobOperations, "start", "operations", _timed_await)
        method(JobOperations, "check_accepting", "check_accepting", _timed_await)
        method(JobOperations, "_hand_over", "hand_over", _timed_call)
        method(spec_type, "validate_arguments", "validate", _timed_call)
        method(HandleCodec, "mint", "mint", _timed_call)
        # The store's connections and SQLite's write transaction are timed only for the start's insert, not for
        # the reads and the job's outcome that use them too.
        inserting = [False]

        def insert(fn: Callable[..., Any], values: list[float]) -> Callable[..., Any]:
            timed_insert = _timed_call(fn, values)

            def call(*args: Any, **kwargs: Any) -> Any:
                inserting[0] = True
                try:
                    return timed_insert(*args, **kwargs)
                finally:
                    inserting[0] = False

            return call

        def insert_on_loop(fn: Callable[..., Any], values: list[float]) -> Callable[..., Any]:
            timed_insert = _timed_await(fn, values)

            async def call(*args: Any, **kwargs: Any) -> Any:
                inserting[0] = True
                try:
                    return await timed_insert(*args, **kwargs)
                finally:
                    inserting[0] = False

            return call

        if postgres:
            method(JobRepository, "start_on_loop", "insert", insert_on_loop)
        else:
            method(JobRepository, "insert", "insert", insert)
        for name, key in (
            ("check_size", "check_size"),
            ("arguments_digest", "digest"),
        ):
            patch(_patched(operations_module, name, _timed_call(getattr(operations_module, name), s[key])))
        if postgres:
            # The shielded task that stores and hands over, as the start awaits it.
            patch(
                _patched(
                    operations_module,
                    "run_shielded",
                    _timed_await(operations_module.run_shielded, s["stored"]),
                )
            )
            prepared = repo._prepare(_START)
            connections = repo.loop_connections
            checkout = _timed_around_async(
                connections.connection, s["pool"], lambda: inserting[0], s["database"]
            )
            patch(_patched(connections, "connection", checkout))
        else:
            method(Store, "start", "stored", _timed_call)
            writing = repo._sqlite_writing
            patch(_patched(repo, "_sqlite_writing", _timed_transaction(writing, s, lambda: inserting[0])))
            prepared = repo._engine._start[1]  # the INSERT of the job's row (SqliteOps)
        patch(_patched(prepared, "parameters", _timed_call(prepared.parameters, s["bind"])))
        yield


async def measure(data_dir: Any, database_url: str, n: int, warmup: int) -> dict[str, list[float]]:
    from handles.server.handle_tools import JobTools

    samples: dict[str, list[float]] = {key: [] for key, _, _ in PARTS}
    async with inprocess(data_dir, database_url) as (jobs, c):
        tools = JobTools(jobs.specs["work"], jobs.service)
        floor: DriverInsert | None = None
        try:
            # First every start untimed (the handler as section 2 times it), then every start with each
            # part timed: the timers are put in once, since patching a class at every start would
            # undo what the interpreter specialises for it.
            for timing in (False, True):
                with _timers(jobs, samples) if timing else contextlib.nullcontext():
                    for _ in range(warmup + n):
                        elapsed, reply = await timed(lambda: tools.start(PRINCIPAL, {"seconds": 0}))
                        if not timing:
                            samples["untimed"].append(elapsed)
                        assert not reply.is_error, reply.structured
                        await structured(
                            c, "work_fetch", {"handle": reply.structured["handle"], "wait_seconds": 10}
                        )
                        if floor is None:
                            floor = DriverInsert(jobs)
                        began = time.perf_counter()
                        floor()
                        samples["floor"].append(time.perf_counter() - began)
                        await c.call_tool("noop", {})
        finally:
            if floor is not None:
                floor.close()
    return samples


def _p50_us(values: list[float], skip: int) -> float | None:
    kept = values[skip:]
    return statistics.median(kept) * 1e6 if kept else None


def _derived(p50: dict[str, float | None], *, postgres: bool) -> None:
    def minus(a: str, b: str) -> float | None:
        x, y = p50.get(a), p50.get(b)
        return None if x is None or y is None else x - y

    p50["store_python"] = minus("insert", "database")
    # On PostgreSQL the awaited task holds the hand-over too; on an SQLite file `Store.start` does not.
    around = minus("stored", "insert")
    hand_over = p50.get("hand_over") if postgres else 0.0
    p50["hop"] = None if around is None or hand_over is None else around - hand_over
    p50["reply"] = minus("handler", "operations")
    p50["beyond_floor"] = minus("untimed", "floor")


async def run(options: Options) -> list[Table]:
    n = options.n(1000, 60)
    warmup = options.n(100, 10)
    table = options.table(
        SECTION,
        "16. The start handler by parts (in-process, section 2's loop, each part timed in place)",
        ["part", "SQLite file p50 us", "PostgreSQL p50 us"],
    )
    results: dict[str, dict[str, float | None]] = {}
    with sqlite_and_postgres(options, "start_parts", table) as stores:
        for name, url, data_dir in stores:
            log(f"start_parts: {name}")
            samples = await measure(data_dir, url, n, warmup)
            # Parts timed once per start (the insert may run twice on an SQLite file when its inline try
            # met a writer: rare with one client) are read past the same warm-up.
            samples["floor"] = samples["floor"][warmup : warmup + n] + samples["floor"][2 * warmup + n :]
            p50 = {
                key: _p50_us(values, 0 if key == "floor" else warmup)
                for key, values in samples.items()
                if values
            }
            _derived(p50, postgres=name == "PostgreSQL")
            results[name] = p50
            table.data[name] = {key: value for key, value in p50.items() if value is not None}
            table.data[name]["n"] = n
    unreachable = {row[0] for row in table.rows}
    table.rows = []
    for key, depth, label in PARTS:
        cells = []
        for name in ("SQLite file", "PostgreSQL"):
            value = results.get(name, {}).get(key)
            cells.append("unreachable" if name in unreachable else "n/a" if value is None else f"{value:.0f}")
        table.rows.append([f"{'· ' * depth}{label}", *cells])
    table.notes += [
        f"Section 2's loop on one server: the start of a 0 s job, its job awaited (`work_fetch`, untimed), the "
        f"floor, a no-op MCP call; {n} starts with no timer in them, then {n} with each part wrapped in a "
        f"`time.perf_counter` timer ({warmup} not counted before each). A part's timer is in its row and in "
        "its enclosing rows: the timed handler's row minus the untimed one's is what the timers cost together.",
        "A row with more dots is inside the nearest row above it with fewer. Each row is the p50 of that part "
        "alone, so the parts do not add up exactly; a derived row is the difference of p50s of the same starts. "
        "On an SQLite file the start's insert runs on the event loop, with no task and no hop.",
        "The targets of issue 14: the handler <= 250 us on the SQLite file, <= 1,000 us on PostgreSQL. The "
        "floor is what no start can go under on this host; the handler - the floor is what the package adds.",
    ]
    return [table]
