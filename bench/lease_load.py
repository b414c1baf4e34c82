"""Section lease_load: what renewing the leases of running jobs costs PostgreSQL, by lease and heartbeat setting.

1,000 running jobs, leased by a few simulated nodes (owners), in a fresh schema; each owner's real
`LeaseKeeper` renews its jobs' leases every heartbeat interval for a bounded time per setting. Counted
for each: the statements and transactions the renewals issue (SQLAlchemy's own events on the store's
engine), the rows PostgreSQL updated in the jobs table (`pg_stat_user_tables` of the schema, so other
work on the database does not count), the CPU time of this process and of the PostgreSQL backends
serving it (from /proc, when the server runs on this host; opening their connections included), and the
time one renewal takes. Also given:
how long after its node dies a job is taken over (the lease plus one sweep) and how long a node may
stall before it loses its jobs.

    python bench/lease_load.py                    # every setting, 20 s each
    python bench/lease_load.py --seconds 5        # shorter windows
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import DEFAULT_POSTGRES_URL, Options, Stats, Table, log, postgres_schema

SECTION = "lease_load"
JOBS = 1000
OWNERS = 4
SETTINGS = ((30.0, 2.0), (15.0, 2.0), (10.0, 3.0), (10.0, 2.0), (5.0, 1.0))
"""(lease seconds, heartbeat seconds): the earlier defaults first, then shorter leases."""
APPLICATION = "bench_lease_load"


@dataclass
class Window:
    """What one setting's renewals cost over `seconds`."""

    lease: float
    heartbeat: float
    interval: float
    seconds: float
    statements: int
    commits: int
    rows_updated: int
    hot_updated: int
    process_cpu: float
    backend_cpu: float | None
    beats: list[float]


def _query(url: str, sql: str, **parameters: Any) -> list[Any]:
    """The rows of `sql`, run in a transaction on a connection of its own (committed)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            return list(connection.execute(text(sql), parameters))
    finally:
        engine.dispose()


def _table_updates(url: str) -> tuple[int, int]:
    """Rows updated (all, and HOT) in the schema's jobs table so far, as PostgreSQL counts them."""
    from tests.harness.postgres import schema_of

    ((updated, hot),) = _query(
        url,
        "select n_tup_upd, n_tup_hot_upd from pg_stat_user_tables "
        "where schemaname = :schema and relname = 'handles_jobs'",
        schema=schema_of(url),
    )
    return int(updated), int(hot)


def _backend_cpu(url: str) -> dict[int, float] | None:
    """CPU seconds so far of each PostgreSQL backend serving this section's store; None when the server's
    processes are not readable from here."""
    from tests.harness.process import cpu_seconds

    pids = _query(url, "select pid from pg_stat_activity where application_name = :name", name=APPLICATION)
    found = {pid: cpu_seconds(pid) for (pid,) in pids}
    if any(value is None for value in found.values()):
        return None
    return {pid: value for pid, value in found.items() if value is not None}


def _seed_running(url: str, owners: int) -> None:
    """`JOBS` jobs, running and leased by `owners` simulated nodes in turn."""
    from tests.harness.seed import seed_jobs

    seed_jobs(url, JOBS, kind="lease_load", id_prefix="lease-")
    _query(
        url,
        "update handles_jobs set status = 'working', result = null, finished_at = null, attempts = 1, "
        "lease_owner = 'owner-' || (right(id, 5)::int % :owners), lease_expires_at = now() + interval '1 hour' "
        "returning id",
        owners=owners,
    )


async def _renew(url: str, lease: float, heartbeat: float, seconds: float, owners: int) -> Window:
    """Each owner's `LeaseKeeper` renewing its jobs for `seconds`, counted."""
    from sqlalchemy import event

    from handles.config import HandlesConfig
    from handles.runtime.leases import LeaseKeeper
    from handles.store import JobRepository, Store
    from tests.harness.postgres import named

    config = HandlesConfig(lease_seconds=lease, heartbeat_seconds=heartbeat)
    repo = JobRepository(named(url, APPLICATION))
    store = Store.of(repo)
    held = {f"owner-{n}": [f"lease-{i:05d}" for i in range(JOBS) if i % owners == n] for n in range(owners)}
    keepers = [
        LeaseKeeper(
            store=store,
            owner=owner,
            config=config,
            held=lambda ids=ids: ids,  # type: ignore[misc]
            on_cancel=lambda _job: None,
            on_lost=lambda job: log(f"lease_load: lost {job}"),
        )
        for owner, ids in held.items()
    ]
    counts = {"statements": 0, "commits": 0}
    beats: list[float] = []
    try:
        for keeper in keepers:  # statements compiled before the window
            await keeper.beat()
        # Its connections closed, so PostgreSQL has counted their updates before the window (a backend
        # flushes its table counts when it ends, otherwise only now and then).
        repo.engine.dispose()
        await asyncio.sleep(1.0)
        event.listen(repo.engine, "before_cursor_execute", lambda *_: _add(counts, "statements"))
        event.listen(repo.engine, "commit", lambda *_: _add(counts, "commits"))
        for keeper in keepers:
            keeper.beat = _timed(keeper.beat, beats)  # type: ignore[method-assign]
        updated_before, hot_before = _table_updates(url)
        cpu_before, started = time.process_time(), time.perf_counter()
        runs = [asyncio.create_task(keeper.run()) for keeper in keepers]
        await asyncio.sleep(seconds)
        for run in runs:
            run.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
        elapsed, process_cpu = time.perf_counter() - started, time.process_time() - cpu_before
        backends = _backend_cpu(url)
        statements, commits = counts["statements"], counts["commits"]
    finally:
        repo.dispose()
    await asyncio.sleep(1.5)  # the backends have gone; their table counts are flushed as they end
    updated_after, hot_after = _table_updates(url)
    backend_cpu = None if backends is None else sum(backends.values())
    return Window(
        lease,
        heartbeat,
        config.heartbeat_interval,
        elapsed,
        statements,
        commits,
        updated_after - updated_before,
        hot_after - hot_before,
        process_cpu,
        backend_cpu,
        beats,
    )


def _add(counts: dict[str, int], name: str) -> None:
    counts[name] += 1


def _timed(beat: Callable[[], Awaitable[None]], into: list[float]) -> Callable[[], Awaitable[None]]:
    async def timed() -> None:
        began = time.perf_counter()
        await beat()
        into.append(time.perf_counter() - began)

    return timed


def _row(window: Window, sweep: float) -> list[Any]:
    per_second = 1 / window.seconds
    beat = Stats.of(window.beats)
    backend = "n/a" if window.backend_cpu is None else f"{1000 * window.backend_cpu * per_second:.1f}"
    return [
        f"{window.lease:g} s / {window.heartbeat:g} s",
        f"{window.interval:g} s",
        f"{window.statements * per_second:.1f}",
        f"{window.commits * per_second:.1f}",
        f"{window.rows_updated * per_second:.0f} ({window.hot_updated * per_second:.0f} HOT)",
        f"{1000 * window.process_cpu * per_second:.1f}",
        backend,
        beat.p50_p99,
        f"{window.lease + sweep:g} s",
        f"{window.lease - window.interval:g} s",
    ]


async def run(options: Options, seconds: float | None = None, owners: int = OWNERS) -> list[Table]:
    from handles.config import HandlesConfig
    from handles.store import JobRepository

    window = seconds if seconds is not None else (5.0 if options.quick else 20.0)
    sweep = HandlesConfig().sweep_interval_seconds
    table = Table(
        section=SECTION,
        title=f"Lease renewals of {JOBS} running jobs held by {owners} nodes, on PostgreSQL ({window:g} s per setting)",
        columns=[
            "lease / heartbeat",
            "renewal every",
            "statements/s",
            "transactions/s",
            "rows updated/s",
            "this process CPU ms/s",
            "PostgreSQL CPU ms/s",
            "one renewal p50 / p99",
            "takeover within",
            "stall tolerated",
        ],
        command=options.section_command(SECTION),
    )
    with postgres_schema(options.postgres_url, SECTION) as url:
        if url is None:
            table.notes.append("PostgreSQL was unreachable: nothing measured.")
            return [table]
        repo = JobRepository(url)
        repo.prepare(auto_migrate=True)
        repo.dispose()
        _seed_running(url, owners)
        for lease, heartbeat in SETTINGS:
            log(f"lease_load: lease {lease:g} s, heartbeat {heartbeat:g} s for {window:g} s")
            measured = await _renew(url, lease, heartbeat, window, owners)
            table.rows.append(_row(measured, sweep))
            table.data[f"{lease:g}/{heartbeat:g}"] = {
                "interval": measured.interval,
                "seconds": measured.seconds,
                "statements": measured.statements,
                "commits": measured.commits,
                "rows_updated": measured.rows_updated,
                "process_cpu": measured.process_cpu,
                "backend_cpu": measured.backend_cpu,
                "renewal": Stats.of(measured.beats).as_dict(),
            }
    table.notes += [
        "A node renews every min(heartbeat, lease / 3); each renewal is one transaction (an UPDATE of the "
        "node's held jobs and a SELECT of their cancel requests), whatever the lease.",
        f"takeover within: the lease plus one sweep ({sweep:g} s), the longest a dead node's job waits before "
        "another node settles it; stall tolerated: how long a live node may go without renewing before its "
        "jobs are taken from it.",
    ]
    return [table]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python bench/lease_load.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="how long each setting renews (20)")
    parser.add_argument(
        "--owners", type=int, default=OWNERS, help=f"simulated nodes holding the jobs ({OWNERS})"
    )
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    args = parser.parse_args()
    options = Options(postgres_url=args.postgres_url, command="python bench/lease_load.py")
    for table in asyncio.run(run(options, args.seconds, args.owners)):
        print(table.markdown())


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
