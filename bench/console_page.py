"""Section console_page: the operator console's jobs page by number of stored jobs (10^3 .. 10^6).

The job table is seeded in bulk as in section 4 (`tests.harness.seed`: completed jobs of one kind,
all created at the same instant, so the keyset's tie-break on the id does all the work). At each
size the console app (`handles.console.console_app`, Starlette's TestClient, a bearer token) is asked
for the first page, a page deep in the table (its keyset cursor), the same page filtered by kind and
by a status no job has, the JSON feed the live update polls every 2 s, and the overview.
"""

from __future__ import annotations

import os
import random
import secrets
import time

from bench.common import Options, Stats, Table, log, quiet_gc, seeded_to, sqlite_and_postgres, verdict

SECTION = "console_page"
TARGET_MS = 100.0
TOKEN = "bench-console-token-" + "b" * 24


def measure(url: str, rounds: int, warmup: int) -> dict[str, list[float]]:
    from starlette.testclient import TestClient

    from handles.console import console_app

    # the console reads its sealing keys as the CLI does; nothing is sealed here
    os.environ.setdefault("HANDLES_SECRET_KEYS", secrets.token_urlsafe(48))
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(console_app(url, token=TOKEN), headers=headers) as client:
        first = client.get("/api/jobs").json()
        # a cursor deep in the table: walk a few pages, then take the cursor of the last one
        cursor = first["next"]
        for _ in range(3):
            cursor = client.get("/api/jobs", params={"after": cursor}).json()["next"] or cursor
        calls = {
            "jobs page": ("/", {}),
            "jobs page, deep cursor": ("/", {"after": cursor}),
            "jobs page, kind filter": ("/", {"kind": "work"}),
            "jobs page, status no job has": ("/", {"status": "failed"}),
            "live feed (JSON)": ("/api/jobs", {}),
            "overview": ("/overview", {}),
        }
        samples: dict[str, list[float]] = {name: [] for name in calls}
        order = list(calls)
        for index in range(warmup + rounds):
            random.shuffle(order)
            for name in order:
                path, params = calls[name]
                started = time.perf_counter()
                reply = client.get(path, params=params)
                elapsed = time.perf_counter() - started
                assert reply.status_code == 200, (name, reply.status_code)
                if index >= warmup:
                    samples[name].append(elapsed)
    return samples


async def run(options: Options) -> list[Table]:
    sizes = [1_000, 10_000] if options.quick else [1_000, 100_000, 1_000_000]
    rounds = options.n(100, 10)
    warmup = options.n(10, 3)
    names = [
        "jobs page",
        "jobs page, deep cursor",
        "jobs page, kind filter",
        "jobs page, status no job has",
        "live feed (JSON)",
        "overview",
    ]
    table = options.table(
        SECTION,
        "Console: the jobs page by number of stored jobs (p50 / p99 ms)",
        ["store", "stored jobs", *names, f"jobs page p99 <= {TARGET_MS:.0f} ms"],
    )
    with sqlite_and_postgres(options, "console", table, sqlite_url=True) as stores:
        for label, url, _data_dir in stores:
            from handles.store import JobRepository

            repository = JobRepository(url)
            repository.prepare(auto_migrate=True)
            repository.dispose()
            table.data[label] = {}
            for size in sizes:
                seeded_to(url, size, f"console_page: {label}")
                quiet_gc()
                log(f"console_page: {label}, {size} jobs, {rounds} rounds")
                stats = {name: Stats.of(values) for name, values in measure(url, rounds, warmup).items()}
                table.data[label][size] = {name: s.as_dict() for name, s in stats.items()}
                worst = max(stats[name].p99 for name in names[:4])
                table.rows.append(
                    [
                        label,
                        f"{size:,}",
                        *(stats[name].p50_p99 for name in names),
                        verdict(worst <= TARGET_MS),
                    ]
                )
    table.notes += [
        "Through Starlette's TestClient in the benchmark's process (no network), with the operator token as "
        "a bearer header; a page is 50 jobs rendered as HTML, the feed the same rows as JSON.",
        "The verdict takes the worst p99 of the four jobs-page variants. The overview counts only "
        "unfinished jobs (none here) and the failures of the last hour.",
        "No ANALYZE is run after seeding.",
    ]
    return [table]
