"""Section 18: group commit, what one transaction for several starts would save each start (the driver alone).

Issue 14 lists group commit (one transaction for the writes of concurrent calls) among the directions worth
measuring. This section measures what it could save at most, below the package: the job's row inserted by the
database driver alone, as section 2's floor inserts it (`DriverInsert`), `k` rows per transaction against one
row per transaction, k = 1, 2, 4, 8, in shuffled order within each round. Each figure is the time per row.

- SQLite file (WAL, synchronous=NORMAL): one writer at a time, so without grouping `k` starts are `k`
  transactions one after another; grouped, one `BEGIN IMMEDIATE` ... `COMMIT` holds the `k` inserts.
- PostgreSQL (autocommit, the server's default synchronous_commit): without grouping, `k` connections insert
  one row each at the same moment (`k` threads released together), so the server may already share one WAL
  flush among their commits; grouped, one connection inserts the `k` rows in one transaction. The time per
  row is the wall time from the first insert's start to the last one's end, divided by `k`.

Each variant is measured with the rows of one principal (as the bench's clients are) and with a principal
each (the rows then land on different pages of the principal's index as well as of the id's).
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import Options, Stats, Table, inprocess, log, sqlite_and_postgres, structured
from bench.durable import DriverInsert

SECTION = "group_commit"
GROUPS = (1, 2, 4, 8)
SPREADS = ("one principal", "a principal each")


class _Group:
    """`k` inserts of the newest job's row, each with a fresh id (and, spread, a fresh principal key): grouped
    in one transaction on `first`'s connection, or one per connection of `drivers` at the same moment."""

    def __init__(self, drivers: list[DriverInsert]) -> None:
        self.drivers = drivers
        self.postgres = drivers[0].postgres

    def rows(self, k: int, spread: bool) -> list[list[Any]]:
        return [self.drivers[0].fresh_row(principal=spread) for _ in range(k)]

    def grouped(self, rows: list[list[Any]]) -> float:
        """Seconds per row, the rows inserted in one transaction on one connection."""
        began = time.perf_counter()
        self.drivers[0].insert_all(rows)
        return (time.perf_counter() - began) / len(rows)

    def separate(self, rows: list[list[Any]]) -> float:
        """Seconds per row, each row its own transaction: one after another on SQLite (one writer at a
        time); on PostgreSQL one connection each, all released together."""
        if not self.postgres or len(rows) == 1:
            began = time.perf_counter()
            for row in rows:
                self.drivers[0].insert_all([row])
            return (time.perf_counter() - began) / len(rows)
        spans: list[tuple[float, float]] = []
        barrier = threading.Barrier(len(rows))

        def insert(driver: DriverInsert, row: list[Any]) -> None:
            barrier.wait()
            began = time.perf_counter()
            driver.insert_all([row])
            spans.append((began, time.perf_counter()))

        threads = [
            threading.Thread(target=insert, args=(driver, row))
            for driver, row in zip(self.drivers, rows, strict=False)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return (max(end for _, end in spans) - min(began for began, _ in spans)) / len(rows)


async def measure(
    data_dir: Path, database_url: str, rounds: int, warmup: int
) -> dict[str, dict[int, list[float]]]:
    """Seconds per row by variant (`grouped` / `separate`, each spread) and group size."""
    async with inprocess(data_dir, database_url) as (jobs, c):
        started = await structured(c, "work_start", {"seconds": 0})
        await structured(c, "work_fetch", {"handle": started["handle"], "wait_seconds": 10})
        drivers = [DriverInsert(jobs) for _ in range(max(GROUPS))]
        group = _Group(drivers)
        samples: dict[str, dict[int, list[float]]] = {
            f"{way}|{spread}": {k: [] for k in GROUPS}
            for way in ("separate", "grouped")
            for spread in SPREADS
        }
        order = [(way, spread, k) for way in ("separate", "grouped") for spread in SPREADS for k in GROUPS]
        try:
            for index in range(warmup + rounds):
                random.shuffle(order)
                for way, spread, k in order:
                    rows = group.rows(k, spread == SPREADS[1])
                    took = group.grouped(rows) if way == "grouped" else group.separate(rows)
                    if index >= warmup:
                        samples[f"{way}|{spread}"][k].append(took)
        finally:
            for driver in drivers:
                driver.close()
        return samples


async def run(options: Options) -> list[Table]:
    rounds = options.n(400, 20)
    warmup = options.n(40, 4)
    table = options.table(
        SECTION,
        "18. Group commit: a start's row inserted by the driver alone, k rows per transaction (p50 us per row)",
        [
            "store",
            "rows of",
            *(f"k={k}: one each" for k in GROUPS),
            *(f"k={k}: grouped" for k in GROUPS[1:]),
        ],
    )
    with sqlite_and_postgres(options, "group_commit", table) as stores:
        for name, url, data_dir in stores:
            log(f"group_commit: {name}, {rounds} rounds")
            samples = await measure(data_dir, url, rounds, warmup)
            table.data[name] = {
                variant: {str(k): Stats.of(values).p50 * 1000 for k, values in by_k.items()}  # ms -> us
                for variant, by_k in samples.items()
            }
            for spread in SPREADS:
                separate = table.data[name][f"separate|{spread}"]
                grouped = table.data[name][f"grouped|{spread}"]
                table.rows.append(
                    [
                        name,
                        spread,
                        *(f"{separate[str(k)]:.0f}" for k in GROUPS),
                        *(f"{grouped[str(k)]:.0f}" for k in GROUPS[1:]),
                    ]
                )
    table.notes += [
        f"{rounds} rounds after {warmup} not counted; in each round every variant and k once, in shuffled order. "
        "The row is the newest stored job's, inserted again with a fresh id as section 2's floor inserts it "
        '(the same columns and indexes); "a principal each" gives each row a fresh principal key too.',
        "One each: SQLite, k transactions one after another on one connection (SQLite has one writer at a "
        "time); PostgreSQL, k connections each inserting one row in autocommit, released together (k threads), "
        "so the server can share a WAL flush among their commits. Grouped: the k rows in one transaction on "
        "one connection. k=1 is the same in both.",
        "What group commit could save a start at most is one each minus grouped at the same k, before what it "
        "would cost: each start's reply held until its group commits, and a turn of the loop (at least) to "
        "gather a group.",
    ]
    return [table]
