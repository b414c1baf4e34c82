"""Section 8: PostgreSQL round trips per operation, counted (not timed) from libpq's own protocol trace.

Every connection of the store's engines is traced with libpq's `PQtrace` (through psycopg's
`pgconn.trace`), and a round trip is one `ReadyForQuery` the server sends: the client waits
for it after every simple query and after every `Sync` of the extended protocol, so it counts
exactly the exchanges the client waits on (BEGIN and COMMIT included). The counts do not
depend on the machine's load, unlike every timed section.

Measured through the real service in-process (the official client, no transport), on a node
whose heartbeat, sweeper and dispatcher timers are pushed out of the way, so that only what
the operation itself causes is counted (including follow-on writes it triggers, such as a
lease restated by the database clock, counted for 0.2 s after the reply).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import SIGNING_KEY, Options, Table, inprocess, log, postgres_schema, structured
from handles.handle import HandleCodec

SECTION = "round_trips"
QUIET = {
    "heartbeat_seconds": 30.0,
    "sweep_interval_seconds": 3600.0,
    "store_poll_seconds": 3600.0,
    "switch_cache_seconds": 60.0,  # a start reads the operator switches at most this often
}
"""Timers pushed out of the way, so nothing but the measured operation talks to the database."""


class Tracer:
    """libpq protocol traces of every connection the given engines check out, one file per connection.

    libpq writes a trace through a buffered C stream of its own: what a file holds lags behind what
    was sent (by about one statement's lines), so `mark` and `since` flush each stream first, by
    ending its trace (`PQuntrace` flushes it) and starting it again on the same file. Each connection
    has a file of its own (two sharing one would write over each other)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        # Each traced connection by id, with its trace file. The connection is kept alive here: a closed
        # one freed while another is made could hand its id on, and the new one would pass for traced.
        self._traced: dict[int, tuple[Any, Any]] = {}
        self._lock = threading.Lock()

    def attach(self, engine: Any) -> None:
        from sqlalchemy import event

        event.listen(engine, "checkout", self._on_checkout)

    def attach_loop(self, connections: Any) -> None:
        """Trace each connection `connections` (the store's `LoopConnections`, for starts on the event loop)
        opens, from its opening: attach before the first start."""
        connections.connect = self._tracing(connections.connect)

    def _tracing(self, connect: Any) -> Any:
        async def traced() -> Any:
            connection = await connect()
            self._on_checkout(connection, None, None)
            return connection

        return traced

    def _on_checkout(self, dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        # Checkouts happen on several threads at once: without the lock two new connections could both
        # be named after the same count and write over each other in one file.
        with self._lock:
            key = id(dbapi_connection)
            if key in self._traced:
                return
            handle = open(self.directory / f"conn-{len(self._traced)}.trace", "w")  # noqa: SIM115 - lives with the connection
            self._traced[key] = (dbapi_connection, handle)
            self._trace(dbapi_connection, handle)

    @staticmethod
    def _trace(dbapi_connection: Any, handle: Any) -> None:
        import psycopg

        dbapi_connection.pgconn.trace(handle.fileno())
        dbapi_connection.pgconn.set_trace_flags(
            psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE
        )

    def _flush(self) -> None:
        """Everything libpq has traced so far, in the files (call between operations, not during one)."""
        for connection, handle in self._traced.values():
            if connection.closed:
                continue
            connection.pgconn.untrace()  # flushes libpq's stream (nothing is written through `handle` itself)
            self._trace(connection, handle)

    def mark(self) -> dict[str, int]:
        """Where each trace file ends now."""
        self._flush()
        return {path.name: path.stat().st_size for path in self.directory.glob("*.trace")}

    def since(self, mark: dict[str, int]) -> tuple[int, list[str]]:
        """Round trips since `mark`, and what the client sent in each (its first words).

        psycopg prepares a statement it has run a few times: later runs send only `Bind` with the
        statement's name, so the names are learnt from every `Parse` in the trace, before the mark too.
        """
        trips = 0
        sent: list[str] = []
        self._flush()
        for path in sorted(self.directory.glob("*.trace")):
            prepared: dict[str, str] = {}
            start = mark.get(path.name, 0)
            with path.open() as trace:
                offset = 0
                for line in trace:
                    after_mark = offset >= start
                    offset += len(line.encode())
                    parts = line.rstrip("\n").split("\t")
                    if len(parts) < 4:
                        continue
                    direction, message, body = parts[0], parts[2], parts[3]
                    quoted = body.split('"')[1::2]
                    if direction == "F" and message == "Parse" and len(quoted) >= 2:
                        prepared[quoted[0]] = _gist(quoted[1])
                    if not after_mark:
                        continue
                    if direction == "B" and message == "ReadyForQuery":
                        trips += 1
                    elif direction == "F" and message == "Query":
                        sent.append(_gist(body))
                    elif direction == "F" and message == "Bind" and len(quoted) >= 2:
                        sent.append(prepared.get(quoted[1], "?"))
        return trips, sent

    def close(self) -> None:
        for _, handle in self._traced.values():
            handle.close()


def _gist(body: str) -> str:
    """The first words of a statement a trace line carries, enough to tell which one it is."""
    quoted = [part for part in body.split('"')[1::2] if part.strip()]
    text = max(quoted, key=len) if quoted else body
    words = text.split()
    if not words:
        return "?"
    head = words[0].upper()
    for keyword in ("pg_advisory_xact_lock", "pg_notify", "count(", "handles_start("):
        if keyword in text:
            return f"{head} {keyword.rstrip('(')}"
    if head in ("INSERT", "UPDATE", "DELETE", "SELECT"):
        target = next((w.strip('",') for w in words if w.strip('",').startswith("handles_")), "")
        return f"{head} {target}".strip()
    return head


async def _count(tracer: Tracer, operation: Any, settle: float = 0.2) -> tuple[int, list[str]]:
    mark = tracer.mark()
    await operation()
    await asyncio.sleep(settle)
    return tracer.since(mark)


async def measure(
    url: str, data_dir: Path, n: int, *, run_workers: bool
) -> dict[str, tuple[list[int], list[str]]]:
    from bench.app import gate

    traces = Path(tempfile.mkdtemp(prefix="trace-", dir=data_dir))
    tracer = Tracer(traces)
    results: dict[str, tuple[list[int], list[str]]] = {}

    def record(name: str, trips: int, sent: list[str]) -> None:
        counts, _ = results.setdefault(name, ([], sent))
        counts.append(trips)
        results[name] = (counts, sent)

    async with inprocess(data_dir, url, run_workers=run_workers, **QUIET) as (jobs, c):
        store = jobs.service.store
        repo = store.repo
        for engine in {repo.engine, repo._read_engine}:
            tracer.attach(engine)
        tracer.attach_loop(repo.loop_connections)
        await structured(c, "noop", {})
        for index in range(n):
            mark = f"rt-{run_workers}-{index}"
            started: dict[str, Any] = {}

            async def start(mark: str = mark, started: dict[str, Any] = started) -> None:
                started.update(await structured(c, "work_start", {"seconds": -1, "mark": mark}))

            record(
                "start" if run_workers else "start (queued: a node without workers)",
                *await _count(tracer, start),
            )
            handle = started["handle"]

            async def poll(handle: str = handle) -> None:
                await structured(c, "work_progress", {"handle": handle, "wait_seconds": 0})

            record("progress poll (wait_seconds=0)", *await _count(tracer, poll))
            if not run_workers:
                continue

            claims = HandleCodec([SIGNING_KEY]).inspect(handle)
            assert claims is not None
            running = await store.call(repo.get, claims.job_id)
            step = f"step {index}"

            async def step_start(job: Any = running, step: str = step) -> None:  # as `ctx.step` writes it
                await store.write(job.id, "reported", repo.begin_step, job.id, job.lease_owner, step, 1)

            async def step_outcome(job: Any = running, step: str = step) -> None:
                await store.write(
                    job.id,
                    "reported",
                    repo.finish_step,
                    job.id,
                    job.lease_owner,
                    step,
                    result={"n": 1},
                    attempt=1,
                )

            record(
                "a durable step's start (as `ctx.step` writes it, with its notice)",
                *await _count(tracer, step_start),
            )
            record("a durable step's outcome (with its notice)", *await _count(tracer, step_outcome))

            async def outcome(mark: str = mark) -> None:
                gate(mark).set()  # the job returns; its outcome is written within `_count`'s settling time

            record(
                "a job's outcome (written as the job returns, with its notice)",
                *await _count(tracer, outcome),
            )
            await structured(c, "work_fetch", {"handle": handle, "wait_seconds": 10})

            async def fetch(handle: str = handle) -> None:
                await structured(c, "work_fetch", {"handle": handle, "wait_seconds": 0})

            record("fetch of a completed job", *await _count(tracer, fetch))
    tracer.close()
    return results


async def run(options: Options) -> list[Table]:
    n = options.n(20, 5)
    table = options.table(
        SECTION,
        "8. PostgreSQL round trips per operation (counted from libpq's protocol trace, not timed)",
        ["operation", "n", "round trips (median)", "min", "max", "what the client sent (one run)"],
    )
    with postgres_schema(options.postgres_url, "trips") as url:
        if url is None:
            table.rows.append(["PostgreSQL unreachable", 0, "n/a", "n/a", "n/a", ""])
            return [table]
        for run_workers in (True, False):
            log(f"round_trips: {n} operations, run_workers={run_workers}")
            data_dir = Path(tempfile.mkdtemp(prefix="trips-", dir=options.work_dir))
            measured = await measure(url, data_dir, n, run_workers=run_workers)
            for name, (counts, sent) in measured.items():
                summary = ", ".join(f"{what} x{k}" if k > 1 else what for what, k in Counter(sent).items())
                table.rows.append(
                    [name, len(counts), f"{statistics.median(counts):g}", min(counts), max(counts), summary]
                )
                table.data[f"{name} / run_workers={run_workers}"] = {"counts": counts, "sent": sent}
    table.notes += [
        "A round trip is one `ReadyForQuery` from the server in libpq's trace of the store's connections "
        "(BEGIN, each statement, COMMIT/ROLLBACK each count once); the listener's connection only receives, "
        "and the notices go out after the writes, several at once, on a connection of their own (not counted).",
        "A job's outcome, and a durable step's start and outcome (the calls `ctx.step` makes: "
        "`Store.write` (`reported`) of `begin_step` and `finish_step` for the running job): each one statement in "
        "autocommit, its notice queued once it commits, on a connection of the write engine's pool, which "
        "pings it at checkout (the empty statement `;`) so that a write after a restart or a failover "
        "succeeds at its first try.",
        f"pid {os.getpid()}; psycopg 3; the node's timers are pushed out of the way (`{QUIET}`).",
    ]
    return [table]
