"""Section 2: time to a durable handle, `work_start` latency on an SQLite file and on PostgreSQL.

`work_start` answers only once the job row is committed (the handle is minted after the insert),
so its latency is the time to a durable handle. Measured through the official client in-process
(the whole MCP tool path without a transport) and at the handler (`JobTools.start`, no MCP), in
alternation; after each start the job (0 s) is awaited, untimed, so starts do not overlap.

The floor, in the same loop: the same job row inserted, durably, by the database driver alone on a
connection of its own (no package code, no SQLAlchemy, no MCP): what a start cannot cost less than
on this host and store.
"""

from __future__ import annotations

import secrets
import sqlite3
import time
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from bench.common import Options, Stats, Table, inprocess, log, sqlite_and_postgres, structured, timed

SECTION = "durable"


NEWEST_JOB = "SELECT * FROM handles_jobs ORDER BY created_at DESC LIMIT 1"


class DriverInsert:
    """The floor of a start: the newest stored job's row inserted again (a fresh id each time) by the DB-API driver
    alone, on a connection of its own, committed as durably as the store commits (SQLite: WAL,
    synchronous=NORMAL, `BEGIN IMMEDIATE` ... `COMMIT`; PostgreSQL: autocommit, the server's default
    synchronous_commit). The row's values are the stored ones, so the same columns and indexes are
    written."""

    def __init__(self, jobs: Any) -> None:
        repo = jobs.service.store.repo
        if not repo.sqlite:
            import psycopg
            from psycopg.types.json import Json

            from handles.store.listen import libpq_url

            self._connection: Any = psycopg.connect(libpq_url(repo.url), autocommit=True)
            cursor = self._connection.execute(NEWEST_JOB)
            json_types = {114, 3802}  # json, jsonb
            row = [
                Json(value) if column.type_code in json_types and value is not None else value
                for column, value in zip(cursor.description, cursor.fetchone(), strict=True)
            ]
            marker, self._transaction = "%s", False
        else:
            self._connection = sqlite3.connect(make_url(repo.url).database, isolation_level=None)
            self._connection.execute("PRAGMA journal_mode=WAL")
            self._connection.execute("PRAGMA synchronous=NORMAL")
            self._connection.execute("PRAGMA busy_timeout=5000")
            cursor = self._connection.execute(NEWEST_JOB)
            row = list(cursor.fetchone())
            marker, self._transaction = "?", True
        columns = [column[0] for column in cursor.description]
        self.postgres = not self._transaction
        self._id_at = columns.index("id")
        self._principal_key_at = columns.index("principal_key")
        self._row = row
        self._sql = (
            f"INSERT INTO handles_jobs ({', '.join(columns)}) VALUES ({', '.join([marker] * len(columns))})"
        )

    def __call__(self) -> None:
        self.insert_all([self.fresh_row()])

    def fresh_row(self, *, principal: bool = False) -> list[Any]:
        """The stored row's values with a fresh id (and, with `principal`, a fresh principal key)."""
        row = list(self._row)
        row[self._id_at] = secrets.token_urlsafe(18)
        if principal:
            row[self._principal_key_at] = secrets.token_hex(32)
        return row

    def insert_all(self, rows: list[list[Any]]) -> None:
        """`rows` inserted in one transaction (one row in autocommit on PostgreSQL)."""
        if self._transaction:
            self._connection.execute("BEGIN IMMEDIATE")
            for row in rows:
                self._connection.execute(self._sql, row)
            self._connection.execute("COMMIT")
        elif len(rows) == 1:
            self._connection.execute(self._sql, rows[0])
        else:
            with self._connection.transaction():
                for row in rows:
                    self._connection.execute(self._sql, row)

    def close(self) -> None:
        self._connection.close()


async def measure(data_dir: Path, database_url: str, n: int, warmup: int) -> dict[str, list[float]]:
    from handles.server.handle_tools import JobTools

    async with inprocess(data_dir, database_url) as (jobs, c):
        tools = JobTools(jobs.specs["work"], jobs.service)
        principal = "local:local"
        samples: dict[str, list[float]] = {"mcp": [], "handler": [], "floor": [], "noop": []}
        floor: DriverInsert | None = None
        try:
            for index in range(warmup + n):
                elapsed, data = await timed(lambda: structured(c, "work_start", {"seconds": 0}))
                await structured(c, "work_fetch", {"handle": data["handle"], "wait_seconds": 10})
                direct, reply = await timed(lambda: tools.start(principal, {"seconds": 0}))
                assert not reply.is_error, reply.structured
                await structured(c, "work_fetch", {"handle": reply.structured["handle"], "wait_seconds": 10})
                if floor is None:
                    floor = DriverInsert(jobs)
                started = time.perf_counter()
                floor()
                driver = time.perf_counter() - started
                base, _ = await timed(lambda: c.call_tool("noop", {}))
                if index >= warmup:
                    samples["mcp"].append(elapsed)
                    samples["handler"].append(direct)
                    samples["floor"].append(driver)
                    samples["noop"].append(base)
        finally:
            if floor is not None:
                floor.close()
        return samples


async def run(options: Options) -> list[Table]:
    n = options.n(1000, 60)
    warmup = options.n(50, 10)
    table = options.table(
        SECTION,
        "2. Time to a durable handle: work_start latency by store",
        ["store", "path", "n", "p50 ms", "p90 ms", "p99 ms", "max ms"],
    )
    with sqlite_and_postgres(options, "durable", table) as stores:
        for label, url, data_dir in stores:
            log(f"durable: {label}, {n} starts")
            samples = await measure(data_dir, url, n, warmup)
            table.data[label] = {}
            for path, key in (
                ("work_start via mcp.Client (in-process)", "mcp"),
                ("JobTools.start handler (no MCP)", "handler"),
                ("floor: the same job row inserted durably by the driver alone", "floor"),
                ("no-op plain tool via mcp.Client (reference)", "noop"),
            ):
                s = Stats.of(samples[key])
                table.data[label][key] = s.as_dict()
                table.rows.append([label, path, s.n, *s.cells("p50", "p90", "p99", "maximum")])
    table.notes += [
        "SQLite: a file in WAL mode with synchronous=NORMAL (the defaults of handles' SQLite store): a commit "
        "is durable against a process crash, not against power loss before the next checkpoint.",
        "PostgreSQL: local server over TCP (127.0.0.1), psycopg 3, default synchronous_commit; each run works "
        "in a fresh schema.",
        "Each sample is one start of a 0 s job; the job is awaited (untimed) before the next start.",
        "Floor: in the same loop, right after the handler's job is awaited, the newest stored job's row is "
        "inserted again with a fresh id by the DB-API driver alone (sqlite3 / psycopg) on a connection of its "
        "own, committed as durably as the store commits (SQLite: BEGIN IMMEDIATE ... COMMIT; PostgreSQL: "
        "autocommit): the same columns and indexes written, no package code, no SQLAlchemy, no MCP. No start "
        "can cost less on this host and store; the handler minus the floor is the package's share.",
    ]
    return [table]
