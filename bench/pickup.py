"""Section 3: pickup and wake on one node.

- pickup: from the moment `work_start` is called to the first line of the job function
  (and, for reference, from the moment `work_start` answered; negative when the job was
  already running before the answer reached the client). In the same rounds, the same start with its job
  before its reply: the runtime's reply-first turns off for it (bench-only), as before change 26.
- wake: a client waits in a long-poll (`work_fetch` / `work_progress` with `wait_seconds=10`);
  the job function then returns; wake is the time from its return to the long-poll's answer
  (the outcome write, the local notification, the re-read and the reply).

In-process (`mcp.Client(server)`), so the job function and the client share one clock. The pickup is also
measured with the client in a process of its own, over stdio and over Streamable HTTP (`python -m bench.app`
on the same database): the job's function writes when it begins to a file (`BENCH_STARTED_FILE`), on the
system-wide monotonic clock both processes share.

The least a pickup could take, in the same rounds: the SDK's own in-process call of an async tool that does
nothing, on a bare `MCPServer` (no `handles` code: what any tool call costs before its tool runs), plus the
job's row inserted durably by the database driver alone (section 2's floor). A start is a tool call that
stores its job before the job may run, so its pickup cannot take less than these two on this host.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.common import (
    Options,
    Stats,
    Table,
    client,
    inprocess,
    log,
    postgres_schema,
    quiet_gc,
    served,
    structured,
    timed,
    verdict,
)

if TYPE_CHECKING:
    from bench.durable import DriverInsert

SECTION = "pickup"
PICKUP_TARGET_MS = 5.0
WAKE_TARGET_MS = 20.0


async def _until_started(mark: str, timeout: float = 10.0) -> None:
    from bench.app import STARTED

    deadline = time.perf_counter() + timeout
    while mark not in STARTED:
        if time.perf_counter() > deadline:
            raise TimeoutError(f"job {mark} never started")
        await asyncio.sleep(0.0005)


def _bare_server() -> Any:
    """An `MCPServer` with one async tool that does nothing, and no `handles` code at all."""
    from mcp.server.mcpserver import MCPServer

    server: MCPServer[Any] = MCPServer("bare")

    async def nothing() -> dict[str, bool]:
        """Do nothing (async: the SDK runs it on the event loop, as it runs the handle tools)."""
        return {"ok": True}

    server.add_tool(nothing, structured_output=True)
    return server


async def _started_after(
    c: Any, mark: str, began: Callable[[str], float] | None = None
) -> tuple[float, float]:
    """A 0 s job started and run to its end: (its function's first line - `work_start` called, its first
    line - `work_start` answered). `began`: when the job marked so began; by default, as this process's
    `bench.app` recorded it (an in-process server)."""
    from bench.app import STARTED

    called = time.perf_counter()
    data = await structured(c, "work_start", {"seconds": 0, "mark": mark})
    answered = time.perf_counter()
    await structured(c, "work_fetch", {"handle": data["handle"], "wait_seconds": 10})
    at = (began or STARTED.__getitem__)(mark)
    return at - called, at - answered


def _began_in(path: Path) -> Callable[[str], float]:
    """When each marked job began, as a server process's `work` jobs write it to `path`
    (`BENCH_STARTED_FILE`: a line `MARK TIME` each), read again when a mark is not known yet."""
    begun: dict[str, float] = {}

    def at(mark: str) -> float:
        if mark not in begun:
            for line in path.read_text().splitlines():
                name, _, time_ = line.partition(" ")
                begun[name] = float(time_)
        return begun[mark]

    return at


@contextlib.contextmanager
def _job_before_reply() -> Iterator[None]:
    """The runtime with no reply-first turns (`REPLY_FIRST_TURNS` = 0, bench-only): a job started by a request
    begins at once, before its start's reply, as before change 26."""
    from handles.runtime import job_runner

    turns = job_runner.REPLY_FIRST_TURNS
    job_runner.REPLY_FIRST_TURNS = 0
    try:
        yield
    finally:
        job_runner.REPLY_FIRST_TURNS = turns


async def _pickup(c: Any, bare: Any, floor: DriverInsert, mark: str) -> dict[str, float]:
    """One round of pickup: a 0 s job started (timed to its function's first line and to the answer), the
    same with the job before the reply, then the least a pickup could take, in the same round (the SDK's own
    call, the durable insert alone)."""
    pickup_call, pickup_answer = await _started_after(c, mark)
    with _job_before_reply():
        job_first, _ = await _started_after(c, f"{mark}-job-first")
    sdk_call, _ = await timed(lambda: structured(bare, "nothing", {}))
    started = time.perf_counter()
    floor()
    insert = time.perf_counter() - started
    return {
        "pickup_call": pickup_call,
        "pickup_answer": pickup_answer,
        "pickup_job_first": job_first,
        "sdk_call": sdk_call,
        "floor": insert,
        "least": sdk_call + insert,
    }


async def _wake(c: Any, tool: str, mark: str) -> float:
    """One round of wake: a job that waits for its gate, a long-poll of `tool` parked on it, the gate opened;
    the time from the job's return to the long-poll's answer."""
    from bench.app import FINISHED, gate

    handle = (await structured(c, "work_start", {"seconds": -1, "mark": mark}))["handle"]
    await _until_started(mark)
    await asyncio.sleep(0.002)  # let the job's "running" writes settle before the waiter parks
    returned: list[float] = []

    async def waiter() -> Any:
        if tool == "work_progress":
            version_seen = await structured(c, tool, {"handle": handle})
            assert version_seen["status"] == "working"
        data = await structured(c, tool, {"handle": handle, "wait_seconds": 10})
        returned.append(time.perf_counter())
        return data

    task = asyncio.create_task(waiter())
    await asyncio.sleep(0.03)  # the long-poll is parked by now
    gate(mark).set()
    data = await task
    if tool == "work_fetch":
        assert data["status"] == "completed", data
    await structured(c, "work_fetch", {"handle": handle, "wait_seconds": 10})
    return returned[0] - FINISHED[mark]


async def _pickup_warm(c: Any, mark: str) -> None:
    """A 0 s job started and run to its end (untimed)."""
    data = await structured(c, "work_start", {"seconds": 0, "mark": mark})
    await structured(c, "work_fetch", {"handle": data["handle"], "wait_seconds": 10})


async def measure(data_dir: Path, database_url: str, n: int, warmup: int) -> dict[str, list[float]]:
    from bench.durable import DriverInsert

    samples: dict[str, list[float]] = {
        key: []
        for key in (
            "pickup_call",
            "pickup_answer",
            "pickup_job_first",
            "sdk_call",
            "floor",
            "least",
            "wake_fetch",
            "wake_progress",
        )
    }
    async with inprocess(data_dir, database_url) as (jobs, c), client(_bare_server(), tasks=False) as bare:
        tag = data_dir.name
        # The floor copies the newest stored job's row: a 0 s job, run to its end first.
        await _pickup_warm(c, f"{tag}-first")
        floor = DriverInsert(jobs)
        try:
            for index in range(warmup + n):
                picked = await _pickup(c, bare, floor, f"{tag}-p{index}")
                woken = {
                    key: await _wake(c, tool, f"{tag}-w{tool}{index}")
                    for key, tool in (("wake_fetch", "work_fetch"), ("wake_progress", "work_progress"))
                }
                if index >= warmup:
                    for key, value in (picked | woken).items():
                        samples[key].append(value)
        finally:
            floor.close()
    return samples


ACROSS = ("stdio", "http")
"""The transports of the pickup with the client in another process."""


async def measure_across(
    transport: str, data_dir: Path, database_url: str, n: int, warmup: int
) -> dict[str, list[float]]:
    """Pickup with the client in another process than the server (`transport`): each round a 0 s job started
    (timed to its function's first line, read back from the file the server's job writes, and to the answer),
    then the no-op plain tool over the same connection."""
    started = data_dir / f"started-{transport}.txt"
    began = _began_in(started)
    samples: dict[str, list[float]] = {"pickup": [], "after_answer": [], "noop": []}
    # The server's `work` jobs write when they begin to `started`.
    env = {"BENCH_STARTED_FILE": str(started)}
    async with served(transport, data_dir, database_url=database_url, tasks=False, **env) as c:
        for index in range(warmup + n):
            pickup, after_answer = await _started_after(c, f"{transport}-{index}", began)
            noop, _ = await timed(lambda: c.call_tool("noop", {}))
            if index >= warmup:
                samples["pickup"].append(pickup)
                samples["after_answer"].append(after_answer)
                samples["noop"].append(noop)
    return samples


async def run(options: Options) -> list[Table]:
    n = options.n(300, 25)
    warmup = options.n(20, 5)
    table = options.table(
        SECTION,
        "3. Pickup and wake (one node, in-process client)",
        ["store", "measure", "n", "p50 ms", "p90 ms", "p99 ms", "target (p50)", "holds"],
    )
    with postgres_schema(options.postgres_url, "pickup") as pg_url:
        for label, url in (("SQLite file", ""), ("PostgreSQL", pg_url)):
            if url is None:
                table.rows.append([label, "PostgreSQL unreachable", 0, "n/a", "n/a", "n/a", "", "n/a"])
                continue
            log(f"pickup: {label}, {n} rounds")
            quiet_gc()
            data_dir = Path(tempfile.mkdtemp(prefix="pickup-", dir=options.work_dir))
            samples = await measure(data_dir, url, n, warmup)
            for transport in ACROSS:
                log(f"pickup: {label}, a client in another process over {transport}, {n} rounds")
                across = await measure_across(transport, data_dir, url, n, warmup)
                for key, values in across.items():
                    samples[f"{key}_{transport}"] = values
            table.data[label] = {}
            for key, what, target in (
                ("pickup_call", "pickup: work_start called -> job function running", PICKUP_TARGET_MS),
                ("pickup_answer", "(job function running - work_start answered)", None),
                (
                    "pickup_job_first",
                    "(pickup with the job before the start's reply: no reply-first turns, bench-only)",
                    None,
                ),
                ("sdk_call", "(the SDK's own call of an async no-op tool, bare server)", None),
                ("floor", "(the job's row inserted durably by the driver alone)", None),
                ("least", "(the least a pickup could take: the two above, per round)", None),
                *(
                    row
                    for transport in ACROSS
                    for row in (
                        (
                            f"pickup_{transport}",
                            f"pickup over {transport}, the client in another process: work_start called -> job "
                            "function running",
                            None,
                        ),
                        (
                            f"after_answer_{transport}",
                            f"(over {transport}: job function running - work_start answered)",
                            None,
                        ),
                        (f"noop_{transport}", f"(over {transport}: the no-op plain tool, same rounds)", None),
                    )
                ),
                ("wake_fetch", "wake: job returned -> waiting work_fetch answers", WAKE_TARGET_MS),
                ("wake_progress", "wake: job returned -> waiting work_progress answers", WAKE_TARGET_MS),
            ):
                s = Stats.of(samples[key])
                table.data[label][key] = s.as_dict()
                holds = None if target is None else s.p50 < target
                table.rows.append(
                    [
                        label,
                        what,
                        s.n,
                        *s.cells("p50", "p90", "p99"),
                        f"< {target:g} ms" if target else "",
                        verdict(holds),
                    ]
                )
    table.notes += [
        "Over stdio and HTTP the client is in a process of its own (`python -m bench.app`, the same database), "
        "so it reads its reply outside the server's event loop; the job's first line is read back from a file "
        "its function writes (`BENCH_STARTED_FILE`), its time on the system-wide monotonic clock both "
        "processes share. The target is judged on the in-process row, as it was set.",
        "Pickup includes the whole work_start call (validation, the durable insert, the handle); with a free "
        "worker slot the job is inserted already leased to the local runtime (claim at insert), so no separate "
        "claim write is needed; the job function starts a few turns of the event loop after the start has answered "
        "(its reply goes first), and this in-process client, on the same loop, takes its reply in those turns.",
        "Pickup with the job before the start's reply: in the same rounds, the same start with the runtime's "
        "reply-first turns set to 0 for it (`REPLY_FIRST_TURNS`, bench-only), so the job's first step goes before "
        "the reply, as it did before change 26. The two rows' difference is what giving this in-process client "
        "its reply first costs a pickup; on one event loop, the job's first step goes into the reply's time instead.",
        "The least a pickup could take is measured in the same rounds: the SDK's in-process call of an async tool "
        "that does nothing, on a bare MCPServer with no handles code (a second in-process client), plus the "
        "newest job's row inserted again, durably, by the database driver alone (section 2's floor). A start "
        "is a tool call that stores its job before it may run, so pickup minus this is what handles itself "
        "spends (its Python, and the turns of the event loop its job leaves the start's reply).",
        "Wake includes the job's outcome write (a compare-and-set transition), the in-process notification, "
        "the waiter's re-read and the reply through the MCP client.",
        "Across nodes a waiter wakes through PostgreSQL LISTEN/NOTIFY, else within store_poll_seconds (1 s); "
        "section 7 measures the cross-node wake.",
    ]
    return [table]
