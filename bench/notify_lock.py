"""Section 21: PostgreSQL's notification lock, what change notices cost concurrent writers, and the wake across nodes.

PostgreSQL takes one lock for the whole cluster at the commit of every transaction that notifies
(`PreCommit_Notify` in async.c: an AccessExclusiveLock on the object of class pg_database, oid 0), so that
notices queue in commit order. A write that notifies in its own transaction therefore commits one at a time
with every other such write of every node. This section measures, on the machine's PostgreSQL:

1. Commits per second of `W` concurrent writers (W = 1, 4, 16, 32), each on a connection of its own, each
   updating its own row in one-statement transactions, for a fixed time:
   (a) plain UPDATEs; (b) the same UPDATE with a `pg_notify` in its transaction (how every write of the
   package notified before); (c) the package's own writes, a running job's progress report
   (`JobRepository.set_progress`, one statement each, a job each) through the store's public API, with its
   change notices (`publishing`: queued once committed, sent by each node's `NoticeSender`) and without. The
   writers are spread over nodes of 8 (one `JobRepository` each, as a node has one). Beside each run, a thread
   samples `pg_locks` every 5 ms for writers waiting on the notification lock.
2. The wake across nodes: a progress report stored through store A (`Store.write`, `reported`) and a waiter on
   the same job in store B, woken by B's change listener; from the call of A's write to the waiter's return.
3. The lock check of the whole service: two HTTP example nodes (`python -m bench.app --http`) on one database,
   `CLIENTS` clients starting 0 s jobs for `SECONDS` s while a thread samples `pg_locks` every 5 ms; the share
   of samples with a writer waiting on the notification lock, and the starts that failed.

Run alone: `python bench/notify_lock.py` (the same as `python bench/run.py --only notify_lock`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.common import (
    Options,
    Stats,
    Table,
    client,
    handles_http_server,
    log,
    ms,
    percentile,
    postgres_schema,
    run_alone,
)

SECTION = "notify_lock"
WRITERS = (1, 4, 16, 32)
PER_NODE = 8
CLIENTS = 24
SECONDS = 8.0
OWNER = "bench-node"
APPLICATION = "handles-notify-lock"
"""The application name of this section's connections: the lock is the cluster's, and only they are counted."""
WAITING_ON_NOTIFY = (
    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE l.locktype = 'object' "
    "AND l.classid = 'pg_database'::regclass AND l.objid = 0 AND NOT l.granted AND a.application_name = %s"
)


def _libpq(url: str) -> str:
    from handles.store.listen import libpq_url

    return libpq_url(url)


class LockSampler:
    """A thread that counts, every 5 ms, this section's backends waiting on the notification lock."""

    def __init__(self, url: str) -> None:
        self._url = _libpq(url)
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(self._url, autocommit=True) as connection:
            while not self._stop.is_set():
                (waiting,) = connection.execute(WAITING_ON_NOTIFY, [APPLICATION]).fetchone() or (0,)
                self.samples.append(int(waiting))
                time.sleep(0.005)

    @contextlib.contextmanager
    def sampling(self) -> Iterator[LockSampler]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()

    @property
    def waiting_share(self) -> float:
        return sum(1 for n in self.samples if n) / max(len(self.samples), 1)

    @property
    def most(self) -> int:
        return max(self.samples, default=0)


def _commits(writers: int, seconds: float, write: Callable[[int], None]) -> float:
    """Commits per second of `writers` threads calling `write(i)` in a loop for `seconds`."""
    counts = [0] * writers
    barrier = threading.Barrier(writers + 1)
    deadline = [0.0]

    def loop(i: int) -> None:
        barrier.wait()
        while time.perf_counter() < deadline[0]:
            write(i)
            counts[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    deadline[0] = time.perf_counter() + seconds
    began = time.perf_counter()
    barrier.wait()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.perf_counter() - began)


def _plain_writers(url: str, writers: int, notify: bool) -> tuple[Callable[[int], None], Callable[[], None]]:
    """(write(i), close): an UPDATE of row i on connection i, with a `pg_notify` in its transaction if `notify`."""
    import psycopg

    connections = [psycopg.connect(_libpq(url), autocommit=True) for _ in range(writers)]
    connections[0].execute("CREATE TABLE IF NOT EXISTS bench_counter (id int PRIMARY KEY, n bigint NOT NULL)")
    connections[0].execute(
        "INSERT INTO bench_counter SELECT g, 0 FROM generate_series(0, %s) g ON CONFLICT DO NOTHING",
        [writers],
    )
    plain = "UPDATE bench_counter SET n = n + 1 WHERE id = %s"
    noticed = f"WITH u AS ({plain} RETURNING id) SELECT pg_notify('handles_bench', 'x ' || id) FROM u"
    statement = noticed if notify else plain

    def write(i: int) -> None:
        connections[i].execute(statement, [i])

    def close() -> None:
        for connection in connections:
            connection.close()

    return write, close


def _package_writers(
    url: str, writers: int, noticed: bool
) -> tuple[Callable[[int], None], Callable[[], None]]:
    """(write(i), close): job i's progress report through `JobRepository.set_progress`, on nodes of
    `PER_NODE` writers (a repository each), published as a node publishes it when `noticed`."""
    from handles.store import JobRepository, utc_now
    from tests.runtime.support import job_row

    nodes = [JobRepository(url) for _ in range(-(-writers // PER_NODE))]
    jobs = []
    for i in range(writers):
        now = utc_now()
        job = job_row(
            f"b-{secrets.token_hex(6)}",
            principal=f"local:b-{i}",
            lease_owner=OWNER,
            lease_expires_at=now + timedelta(hours=1),
            started_at=now,
        )
        nodes[i // PER_NODE].insert(job, active_limit=None)
        jobs.append(job.id)
    done = [0] * writers

    def write(i: int) -> None:
        repo, job_id = nodes[i // PER_NODE], jobs[i]
        done[i] += 1
        if noticed:
            repo.publishing(job_id, OWNER, "reported", repo.set_progress, job_id, OWNER, done[i], None, None)
        else:
            repo.set_progress(job_id, OWNER, done[i], None, None)

    def close() -> None:
        for repo in nodes:
            repo.dispose()

    return write, close


def _starts_and_polls(
    url: str, writers: int, start: bool
) -> tuple[Callable[[int], None], Callable[[], None]]:
    """(call(i), close): a start of a queued job (`JobRepository.insert`, its notice queued as a node's), or a
    progress poll's read of one job (`JobRepository.snapshot`), on nodes of `PER_NODE` callers."""
    from handles.store import JobRepository
    from tests.runtime.support import job_row

    nodes = [JobRepository(url) for _ in range(-(-writers // PER_NODE))]
    polled = job_row(f"p-{secrets.token_hex(6)}", principal="local:polled")
    nodes[0].insert(polled, active_limit=None)

    def call(i: int) -> None:
        repo = nodes[i // PER_NODE]
        if start:
            job = job_row(f"s-{secrets.token_hex(8)}", principal=f"local:s-{i}", status="queued")
            repo.publishing(job.id, OWNER, "queued", repo.insert, job, active_limit=None)
        else:
            repo.snapshot(polled.id)

    def close() -> None:
        for repo in nodes:
            repo.dispose()

    return call, close


VARIANTS: dict[str, Callable[[str, int], tuple[Callable[[int], None], Callable[[], None]]]] = {
    "UPDATE": lambda url, w: _plain_writers(url, w, False),
    "UPDATE + pg_notify in it": lambda url, w: _plain_writers(url, w, True),
    "progress report, no notice": lambda url, w: _package_writers(url, w, False),
    "progress report + its notice": lambda url, w: _package_writers(url, w, True),
    "start + its notice": lambda url, w: _starts_and_polls(url, w, True),
    "poll (a read, no commit)": lambda url, w: _starts_and_polls(url, w, False),
}


def commits(url: str, seconds: float, rounds: int) -> dict[str, dict[int, tuple[float, float]]]:
    """(commits/s, share of lock samples with a waiter) by variant and writer count: the median of `rounds`
    runs of `seconds` each, the variants in a freshly shuffled order in every round."""
    from handles.store import JobRepository

    repository = JobRepository(url)
    repository.prepare(auto_migrate=True)
    repository.dispose()
    figures: dict[str, dict[int, tuple[float, float]]] = {name: {} for name in VARIANTS}
    for writers in WRITERS:
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS}
        for _ in range(rounds):
            for name in random.sample(list(VARIANTS), len(VARIANTS)):
                write, close = VARIANTS[name](url, writers)
                try:
                    for i in range(writers):
                        write(i)  # warm: connections open, statements prepared
                    with LockSampler(url).sampling() as sampler:
                        runs[name].append((_commits(writers, seconds, write), sampler.waiting_share))
                finally:
                    close()
        for name, measured in runs.items():
            figures[name][writers] = sorted(measured)[len(measured) // 2]
            log(f"{SECTION}: {writers} writer(s), {name}: {figures[name][writers][0]:.0f} commits/s")
    return figures


async def wake(url: str, samples: int) -> list[float]:
    """Seconds from the call of store A's write of a job to the return of store B's waiter on it."""
    from handles.store import JobRepository, Store, utc_now
    from tests.runtime.support import job_row

    a, b = Store(JobRepository(url)), Store(JobRepository(url))
    a.origin, b.origin = "node-a", "node-b"
    listening = await b.change_listener(b.notifier.notify)
    assert listening is not None
    task = asyncio.create_task(listening)
    await a.call(a.repo.load_notice_scope)
    latencies: list[float] = []
    try:
        await asyncio.sleep(0.5)  # B's listener connected
        now = utc_now()
        job = job_row(
            f"w-{secrets.token_hex(6)}",
            lease_owner=OWNER,
            lease_expires_at=now + timedelta(hours=1),
            started_at=now,
        )
        await a.call(a.repo.insert, job, active_limit=None)
        for i in range(samples):
            woken = b.notifier.watch(job.id)
            waiter = asyncio.create_task(b.notifier.wait(job.id, 5.0, event=woken))
            await asyncio.sleep(0.01)
            began = time.perf_counter()
            await a.write(job.id, "reported", a.repo.set_progress, job.id, OWNER, i + 1, None, None)
            await waiter
            if woken.is_set():
                latencies.append(time.perf_counter() - began)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        a.repo.dispose()
        b.repo.dispose()
    return latencies


def _stored(url: str) -> dict[str, Any]:
    """The jobs stored in `url`'s schema and the bytes of each of its tables (heap, indexes, TOAST)."""
    import psycopg

    with psycopg.connect(_libpq(url), autocommit=True) as connection:
        (jobs,) = connection.execute("SELECT count(*) FROM handles_jobs").fetchone() or (0,)
        tables = connection.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = current_schema() AND c.relkind = 'r'"
        ).fetchall()
    return {"jobs": jobs, "bytes": {name: size for name, size in tables if size}}


async def service(url: str, work_dir: Path, seconds: float, clients_count: int) -> dict[str, Any]:
    """Two HTTP example nodes, `clients_count` clients starting 0 s jobs for `seconds`, `pg_locks` sampled."""
    servers = [
        handles_http_server(
            work_dir / f"notify-lock-{i}",
            database_url=url,
            HANDLES_MAX_ACTIVE_PER_PRINCIPAL="1000000",
            HANDLES_MAX_RUNNING="64",
        ).start()
        for i in range(2)
    ]
    starts = errors = 0
    try:
        async with AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(client(s.url, tasks=False)) for s in servers]
            turn = itertools.count()

            async def loop(deadline: float) -> None:
                nonlocal starts, errors
                while time.perf_counter() < deadline:
                    try:
                        result = await clients[next(turn) % 2].call_tool("work_start", {"seconds": 0})
                        errors += bool(result.is_error)
                    except Exception:
                        errors += 1
                    starts += 1

            with LockSampler(url).sampling() as sampler:
                deadline = time.perf_counter() + seconds
                await asyncio.gather(*(loop(deadline) for _ in range(clients_count)))
    finally:
        for server in servers:
            server.stop()
    return _stored(url) | {
        "starts_per_s": starts / seconds,
        "failed": errors,
        "samples": len(sampler.samples),
        "waiting_share": sampler.waiting_share,
        "most_waiting": sampler.most,
    }


async def run(options: Options) -> list[Table]:
    seconds, rounds = options.n(1, 0.5), options.n(5, 1)
    columns = ["writers", *VARIANTS, "own writes: with / without notices"]
    table = options.table(
        SECTION,
        "21. The notification lock: commits/s of W concurrent writers (share of 5 ms samples waiting on it)",
        columns,
    )
    wakes = options.table(
        SECTION, "21b. Wake across nodes and the lock under the service's own load", ["measure", "figure"]
    )
    with postgres_schema(options.postgres_url, SECTION) as schema_url:
        if schema_url is None:
            table.rows.append(["unreachable", *([""] * (len(columns) - 1))])
            return [table]
        from tests.harness.postgres import named

        url = named(schema_url, APPLICATION)
        figures = commits(url, seconds, rounds)
        for writers in WRITERS:
            cells = [
                f"{figures[name][writers][0]:,.0f} ({figures[name][writers][1]:.0%})" for name in VARIANTS
            ]
            own = (
                figures["progress report + its notice"][writers][0]
                / figures["progress report, no notice"][writers][0]
            )
            table.rows.append([writers, *cells, f"{own:.2f}x"])
        table.data["commits"] = {
            name: {str(w): list(v) for w, v in by.items()} for name, by in figures.items()
        }
        log(f"{SECTION}: wake across nodes")
        latencies = await wake(url, options.n(200, 30))
        woken, p95 = Stats.of(latencies), percentile(sorted(latencies), 95) * 1000
        wakes.rows.append(
            ["wake across nodes, p50 / p95 / p99 (ms)", f"{ms(woken.p50)} / {ms(p95)} / {ms(woken.p99)}"]
        )
        wakes.data["wake"] = woken.as_dict() | {"p95": p95}
        log(f"{SECTION}: two HTTP nodes, {CLIENTS} clients starting jobs")
        load = await service(url, options.work_dir, options.n(SECONDS, 3), CLIENTS)
        wakes.rows += [
            ["two HTTP nodes: starts/s", f"{load['starts_per_s']:.0f}"],
            ["two HTTP nodes: starts failed", str(load["failed"])],
            [
                "two HTTP nodes: samples with a writer waiting on the lock (most at once)",
                f"{load['waiting_share']:.1%} of {load['samples']} ({load['most_waiting']})",
            ],
        ]
        wakes.rows.append(
            [
                "bytes stored per job: all tables (of which handles_jobs)",
                f"{sum(load['bytes'].values()) / max(load['jobs'], 1):,.0f} "
                f"({load['bytes'].get('handles_jobs', 0) / max(load['jobs'], 1):,.0f})",
            ]
        )
        wakes.data["service"] = load
    table.notes += [
        f"Each cell the median of {rounds} runs of {seconds:g} s, the variants in a shuffled order in every round; each writer its own connection and row (the package's: its own running job, "
        f"on nodes of {PER_NODE} writers, a JobRepository each). In brackets: the share of pg_locks samples, every "
        "5 ms, with a backend waiting on the notification lock.",
        "The last column is the package's progress reports with their change notices over the same reports "
        "without: the notices leave the writes' own transactions, so the writes commit as plain ones.",
    ]
    wakes.notes += [
        "Wake: store A (its own JobRepository) stores a progress report; a waiter on the job in store B, "
        "woken by B's change listener (LISTEN); from the call of A's write to the waiter's return.",
        f"Service: two `python -m bench.app --http` nodes on one schema, {CLIENTS} clients starting 0 s jobs, "
        "pg_locks sampled every 5 ms for a backend waiting on the notification lock.",
    ]
    return [table, wakes]


if __name__ == "__main__":
    run_alone(run, "python bench/notify_lock.py")
