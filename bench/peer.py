"""Section 6: the peer, side by side in one run: FastMCP 4 + fastmcp-tasks (Docket, memory://) vs `handles`.

Both servers run as their own processes over stateless Streamable HTTP and serve the same job
shape, `work(seconds)`, as a tool that becomes a task when the call declares the Tasks extension
(`io.modelcontextprotocol/tasks`) and runs inline otherwise; both advertise `pollIntervalMs=100`.
`handles` stores its state in an SQLite file; the peer keeps its state in Docket's in-memory backend.

One measuring client (the official `mcp` 2.3 client of the project's environment, protocol 2026-07-28)
drives both, alternating between them sample by sample:

- task creation: `tools/call work {seconds: 0}` declaring Tasks -> `CreateTaskResult`;
- start -> result: creation, then `tasks/get` back to back until the task is completed (0 s and 100 ms jobs);
- the requests alone, in the same rounds as start -> result of the 0 s job and creation: a no-op tool call
  and a `tasks/get` of a completed task (the least a task's two requests take);
- calls/s: concurrent workers each running create -> poll -> result cycles of the 0 s job;
- for reference, the same job as a plain call (no extension: inline on both), and on `handles` its
  handle tools (`work_start`, then a long-polling `work_fetch` with `wait_seconds`).

The peer is installed by this module into its own virtual environment, bench/.peer-venv
(`fastmcp-tasks==4.1.4`, which pins its FastMCP), never into the project's dependencies.
"""

from __future__ import annotations

import asyncio
import fcntl
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import (
    BENCH_DIR,
    Options,
    Stats,
    Table,
    client,
    handles_http_server,
    log,
    ms,
    shuffled_rounds,
    verdict,
)
from tests.harness.process import ServerProcess, cpu_seconds, free_port, status_kib

SECTION = "peer"
PEER_VENV = BENCH_DIR / ".peer-venv"
PEER_PYTHON = PEER_VENV / "bin" / "python"
PEER_REQUIREMENT = "fastmcp-tasks==4.1.4"
PEER_PROBE = "import fastmcp, fastmcp_tasks, uvicorn"


def peer_ready() -> bool:
    return venv_ready(PEER_VENV, PEER_PROBE)


def venv_ready(venv: Path, probe: str) -> bool:
    """Whether `venv` exists and `python -c probe` succeeds in it."""
    python = venv / "bin" / "python"
    if not python.exists():
        return False
    # From the venv's own directory: a probe run from a checkout would import the checkout's packages.
    return (
        subprocess.run([str(python), "-c", probe], capture_output=True, timeout=60, cwd=venv).returncode == 0
    )


def ensure_venv(venv: Path, requirements: Sequence[str], probe: str, timeout: float = 600) -> str | None:
    """A virtual environment at `venv` in which `python -c probe` succeeds: created when missing, and
    `requirements` (pip arguments) installed into it when the probe fails; None on success, else why not.

    Processes that prepare the same `venv` at once (the test workers of `pytest -n`) take turns on a lock
    file beside it: the first one installs, the others find it ready."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _prepare_venv(venv, requirements, probe, timeout)


def _prepare_venv(venv: Path, requirements: Sequence[str], probe: str, timeout: float) -> str | None:
    if venv_ready(venv, probe):
        return None
    python = venv / "bin" / "python"
    log(f"preparing {venv}: pip install {' '.join(requirements)}")
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=120)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *requirements], check=True, timeout=timeout
        )
    except (subprocess.SubprocessError, OSError) as exc:
        return f"could not prepare the virtual environment {venv}: {exc}"
    return None if venv_ready(venv, probe) else f"the virtual environment {venv} fails `{probe}`"


def ensure_peer_venv(timeout: float = 600) -> str | None:
    """Create bench/.peer-venv with the peer installed; None on success, else why not."""
    return ensure_venv(PEER_VENV, [PEER_REQUIREMENT, "uvicorn"], PEER_PROBE, timeout)


def peer_server(work: Path) -> ServerProcess:
    port = free_port()
    return ServerProcess(
        [str(PEER_PYTHON), str(BENCH_DIR / "peer_server.py"), "--port", str(port)],
        {"PATH": "/usr/bin:/bin", "HOME": str(work), "PYTHONUNBUFFERED": "1"},
        work / f"peer-{port}.log",
        port,
        start_timeout=60,
    )


# -- one server's operations ---------------------------------------------------------------


class Target:
    """The measuring operations against one server, through two clients (declaring Tasks, and not)."""

    def __init__(self, name: str, tasks_client: Any, plain_client: Any, *, handle_tools: bool) -> None:
        self.name = name
        self.tasks = tasks_client
        self.plain = plain_client
        self.handle_tools = handle_tools
        self.polls: list[int] = []

    async def create(self, seconds: float) -> Any:
        created = await self.tasks.session.call_tool("work", {"seconds": seconds}, allow_claimed=True)
        if getattr(created, "result_type", None) != "task":
            raise RuntimeError(f"{self.name}: a declaring call did not become a task: {created}")
        return created

    async def follow(self, task_id: str, client_: Any | None = None) -> Any:
        from handles.client import get_task

        session = (client_ or self.tasks).session
        polls = 0
        while True:
            polls += 1
            state = await get_task(session, task_id)
            if state.status == "completed":
                self.polls.append(polls)
                return state
            if state.status != "working":
                raise RuntimeError(f"{self.name}: task ended {state.status}: {state.status_message}")

    async def task_roundtrip(self, seconds: float, client_: Any | None = None) -> None:
        created = await (self.create(seconds) if client_ is None else self._create_on(client_, seconds))
        await self.follow(created.task_id, client_)

    async def _create_on(self, c: Any, seconds: float) -> Any:
        created = await c.session.call_tool("work", {"seconds": seconds}, allow_claimed=True)
        if getattr(created, "result_type", None) != "task":
            raise RuntimeError(f"{self.name}: a declaring call did not become a task")
        return created

    async def declared_call(self, tool: str, seconds: float) -> None:
        """A declaring call of `tool`, followed to its result if it became a task (as a Tasks client does)."""
        answer = await self.tasks.session.call_tool(tool, {"seconds": seconds}, allow_claimed=True)
        if getattr(answer, "result_type", None) == "task":
            await self.follow(answer.task_id)
        else:
            self._check(answer, seconds, f"declaring call of {tool}")

    async def resolved_call(self, tool: str, seconds: float) -> None:
        """`call_tool` as an application makes it: the client's `TasksClientExtension` follows a task to its
        result (a `tasks/get` at once, or the state the server pushes; then `pollIntervalMs` between polls)."""
        self._check(await self.tasks.call_tool(tool, {"seconds": seconds}), seconds, f"call_tool {tool}")

    async def plain_call(self, seconds: float) -> None:
        self._check(await self.plain.call_tool("work", {"seconds": seconds}), seconds, "plain call")

    def _check(self, result: Any, seconds: float, what: str) -> None:
        """`work`'s own result for `seconds`, or the call failed."""
        if result.is_error or (result.structured_content or {}).get("slept") != seconds:
            raise RuntimeError(f"{self.name}: {what} failed: {result}")

    async def noop(self) -> None:
        """A no-op tool call by the declaring client: what one request costs with no work behind it."""
        result = await self.tasks.call_tool("noop", {})
        if result.is_error:
            raise RuntimeError(f"{self.name}: noop failed: {result}")

    async def get_completed(self, task_id: str) -> None:
        """One `tasks/get` of a task that has completed: the second request of a start -> result, alone."""
        from handles.client import get_task

        state = await get_task(self.tasks.session, task_id)
        if state.status != "completed":
            raise RuntimeError(f"{self.name}: task {task_id} is {state.status}, not completed")

    async def handle_roundtrip(self, seconds: float) -> None:
        started = await self.plain.call_tool("work_start", {"seconds": seconds})
        handle = started.structured_content["handle"]
        while True:
            fetched = await self.plain.call_tool("work_fetch", {"handle": handle, "wait_seconds": 10})
            if fetched.structured_content["status"] == "completed":
                return


async def _paired(
    targets: list[Target], samples: int, warmup: int, make: Callable[[Target], Callable[[], Awaitable[Any]]]
) -> dict[str, list[float]]:
    """Alternate the targets sample by sample (in shuffled order) so both see the same machine noise."""
    return (await _shuffled_pairs(targets, samples, warmup, {"": make}))[""]


async def _shuffled_pairs(
    targets: list[Target],
    samples: int,
    warmup: int,
    makes: dict[str, Callable[[Target], Callable[[], Awaitable[Any]]]],
) -> dict[str, dict[str, list[float]]]:
    """Several measures of both targets in the same rounds, every (measure, target) pair once per round in
    shuffled order, so that the measures can be compared with each other as well as across the targets."""
    out: dict[str, dict[str, list[float]]] = {key: {t.name: [] for t in targets} for key in makes}
    pairs = [(key, target) for key in makes for target in targets]
    for index in range(warmup + samples):
        random.shuffle(pairs)
        for key, target in pairs:
            call = makes[key](target)
            started = time.perf_counter()
            await call()
            elapsed = time.perf_counter() - started
            if index >= warmup:
                out[key][target.name].append(elapsed)
    return out


async def _throughput(
    url: str, target: Target, workers: int, seconds: float, kind: str, pid: int
) -> tuple[int, float, int, float]:
    """(completed calls, elapsed seconds, errors, the server's CPU seconds meanwhile) of `workers` concurrent
    clients looping for `seconds` against the server process `pid`."""
    done = 0
    errors = 0
    stop_at = 0.0

    async def worker() -> None:
        nonlocal done, errors
        async with client(url, tasks=kind == "task") as c:
            await c.call_tool("noop", {})
            await ready.wait()
            while time.perf_counter() < stop_at:
                try:
                    if kind == "task":
                        await target.task_roundtrip(0.0, c)
                    else:
                        result = await c.call_tool("work", {"seconds": 0.0})
                        if result.is_error:
                            raise RuntimeError(str(result.content))
                    done += 1
                except Exception:
                    errors += 1

    ready = asyncio.Event()
    tasks = [asyncio.create_task(worker()) for _ in range(workers)]
    await asyncio.sleep(1.0)  # let the clients connect
    cpu_before = cpu_seconds(pid) or 0.0
    began = time.perf_counter()
    stop_at = began + seconds
    ready.set()
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - began
    return done, elapsed, errors, (cpu_seconds(pid) or 0.0) - cpu_before


async def _alternating_throughput(
    targets: dict[str, tuple[str, Target, int]], workers: int, window: float, rounds: int, kind: str
) -> dict[str, tuple[float, int, float]]:
    """Calls/s, errors and server CPU ms per call of each server over `rounds` windows of `window / rounds`
    s each, the servers taking turns in shuffled order each round, so that both see the same spells of
    machine noise (one window each, one after the other, moved the ratio by 0.4x between runs on a noisy
    host)."""
    totals = {name: [0, 0.0, 0, 0.0] for name in targets}
    for _ in range(rounds):
        for name in random.sample(list(targets), len(targets)):
            url, target, pid = targets[name]
            measured = await _throughput(url, target, workers, window / rounds, kind, pid)
            for index, value in enumerate(measured):
                totals[name][index] += value
    return {
        name: (done / elapsed, int(errors), 1000 * cpu / done if done else 0.0)
        for name, (done, elapsed, errors, cpu) in totals.items()
    }


# -- the section ----------------------------------------------------------------------------


async def run(options: Options) -> list[Table]:
    table = options.table(
        SECTION,
        "6. Peer side by side: handles (SQLite file) vs FastMCP 4 + fastmcp-tasks (Docket memory://), "
        "Streamable HTTP",
        [
            "measure",
            "handles p50 / p99 ms",
            "peer p50 / p99 ms",
            "handles / peer (p50)",
            "handles faster",
        ],
    )
    if options.quick and not peer_ready():
        table.rows.append(["skipped", "n/a", "n/a", "n/a", "n/a"])
        table.notes.append(
            f"Skipped in --quick mode: {PEER_VENV} does not exist yet (creating it takes a minute or more). "
            "Run `python bench/run.py --only peer` once to create it."
        )
        return [table]
    problem = ensure_peer_venv()
    if problem is not None:
        table.rows.append(["skipped", "n/a", "n/a", "n/a", "n/a"])
        table.notes.append(f"Skipped: {problem}.")
        return [table]

    samples = options.n(300, 15)
    warmup = options.n(20, 5)
    slow_samples = options.n(100, 6)
    workers = options.n(8, 4)
    window = options.n(10.0, 1.5)
    rounds = options.n(4, 1)
    work = Path(tempfile.mkdtemp(prefix="peer-", dir=options.work_dir))
    mine = handles_http_server(work / "handles").start()
    theirs = peer_server(work).start()
    results: dict[str, dict[str, Any]] = {}
    try:
        async with (
            client(mine.url) as mine_tasks,
            client(mine.url, tasks=False) as mine_plain,
            client(theirs.url) as their_tasks,
            client(theirs.url, tasks=False) as their_plain,
        ):
            h = Target("handles", mine_tasks, mine_plain, handle_tools=True)
            p = Target("peer", their_tasks, their_plain, handle_tools=False)
            both = [h, p]
            for t in both:  # list tools once on each client (the SDK client checks outputs against them)
                await t.tasks.call_tool("noop", {})
                await t.plain.call_tool("noop", {})

            log(
                f"peer: start -> result of a 0 s job, task creation, a no-op call and tasks/get of a completed task, "
                f"{samples} samples each, in the same shuffled rounds"
            )
            completed = {t.name: (await t.create(0.0)).task_id for t in both}
            for t in both:  # untimed: the task each server's tasks/get row reads
                await t.follow(completed[t.name])
                t.polls.clear()
            created_ids: dict[str, list[str]] = {"handles": [], "peer": []}

            def creation(t: Target) -> Callable[[], Awaitable[Any]]:
                async def call() -> None:
                    created = await t.create(0.0)
                    created_ids[t.name].append(created.task_id)

                return call

            results.update(
                await _shuffled_pairs(
                    both,
                    samples,
                    warmup,
                    {
                        "result_0": lambda t: lambda: t.task_roundtrip(0.0),
                        "creation": creation,
                        "noop": lambda t: t.noop,
                        "get_completed": lambda t: lambda: t.get_completed(completed[t.name]),
                    },
                )
            )
            # The median polls of the start -> result samples (the other three measures do not poll).
            polls_0 = {t.name: sorted(t.polls)[len(t.polls) // 2] for t in both}
            for t in both:  # untimed: let every created task finish
                for task_id in created_ids[t.name]:
                    await t.follow(task_id)
                t.polls.clear()

            log("peer: start -> result, 100 ms job")
            results["result_100"] = await _paired(
                both, slow_samples, 2, lambda t: lambda: t.task_roundtrip(0.1)
            )
            polls_100 = {t.name: sorted(t.polls)[len(t.polls) // 2] for t in both}

            log(
                "peer: start -> result, 0 s job, handles' work_inline (task_after: its result in the first response)"
            )
            results["inline_0"] = await _paired(
                both,
                samples,
                warmup,
                lambda t: lambda: t.declared_call("work_inline" if t is h else "work", 0.0),
            )
            for t in both:
                t.polls.clear()

            log("peer: plain calls (no extension)")
            results["plain_0"] = await _paired(both, samples, warmup, lambda t: lambda: t.plain_call(0.0))
            results["plain_100"] = await _paired(both, slow_samples, 2, lambda t: lambda: t.plain_call(0.1))
            log("peer: handles' handle tools (start + long-polling fetch)")
            handle_0 = (await _paired([h], samples, warmup, lambda t: lambda: t.handle_roundtrip(0.0)))[
                "handles"
            ]
            handle_100 = (await _paired([h], slow_samples, 2, lambda t: lambda: t.handle_roundtrip(0.1)))[
                "handles"
            ]
            log("peer: handles only, call_tool through TasksClientExtension: work (a task) and work_inline")
            honoured = await shuffled_rounds(
                {
                    "work": lambda: h.resolved_call("work", 0.0),
                    "work_inline": lambda: h.resolved_call("work_inline", 0.0),
                },
                slow_samples,
                2,
            )

        log(f"peer: calls/s, {workers} workers x {window:g} s each, in {rounds} alternating windows")
        throughput: dict[str, dict[str, tuple[float, int, float]]] = {"task": {}, "plain": {}}
        async with client(mine.url) as a, client(theirs.url) as b:
            targets = {
                "handles": (mine.url, Target("handles", a, a, handle_tools=True), mine.pid),
                "peer": (theirs.url, Target("peer", b, b, handle_tools=False), theirs.pid),
            }
            for kind in ("task", "plain"):
                throughput[kind] = await _alternating_throughput(targets, workers, window, rounds, kind)
        memory = {
            "handles": (status_kib(mine.pid, "VmHWM"), cpu_seconds(mine.pid)),
            "peer": (status_kib(theirs.pid, "VmHWM"), cpu_seconds(theirs.pid)),
        }
    finally:
        mine.stop()
        theirs.stop()

    def row(label: str, key: str, *, faster: bool = True) -> None:
        a, b = Stats.of(results[key]["handles"]), Stats.of(results[key]["peer"])
        table.data[key] = {"handles": a.as_dict(), "peer": b.as_dict()}
        table.rows.append(
            [
                label,
                a.p50_p99,
                b.p50_p99,
                f"{a.p50 / b.p50:.2f}x",
                verdict(a.p50 < b.p50) if faster else "",
            ]
        )

    row("task creation (tools/call -> CreateTaskResult)", "creation")
    row(
        f"start -> result, 0 s job (Tasks; median polls: handles {polls_0['handles']}, peer {polls_0['peer']})",
        "result_0",
    )
    row(
        f"start -> result, 100 ms job (Tasks; median polls: handles {polls_100['handles']}, peer {polls_100['peer']})",
        "result_100",
    )
    row("no-op tool call (the declaring client; no work behind it)", "noop", faster=False)
    row(
        "`tasks/get` of a completed task (the second request of start -> result, alone)",
        "get_completed",
        faster=False,
    )
    # A task at once takes two requests: the least they can take is one no-op call and one tasks/get.
    least = Stats.of(results["noop"]["handles"]).p50 + Stats.of(results["get_completed"]["handles"]).p50
    theirs_0 = Stats.of(results["result_0"]["peer"]).p50
    table.data["two_requests_least"] = {"handles_ms": least, "peer_result_0_ms": theirs_0}
    table.rows.append(
        [
            "the least two requests take on handles (its no-op p50 + its `tasks/get` p50), against the peer's "
            "start -> result of a 0 s job",
            ms(least),
            ms(theirs_0),
            f"{least / theirs_0:.2f}x",
            "",
        ]
    )
    for kind, label in (
        ("task", "calls/s, Tasks (create -> poll -> result)"),
        ("plain", "calls/s, plain call (inline)"),
    ):
        ours, peer_ = throughput[kind]["handles"], throughput[kind]["peer"]
        table.data[f"throughput_{kind}"] = {
            "handles": ours,
            "peer": peer_,
            "workers": workers,
            "window_s": window,
            "rounds": rounds,
        }
        table.rows.append(
            [
                f"{label}, {workers} concurrent clients"
                + (f" (errors: handles {ours[1]}, peer {peer_[1]})" if ours[1] or peer_[1] else ""),
                f"{ours[0]:.0f} calls/s",
                f"{peer_[0]:.0f} calls/s",
                f"{ours[0] / peer_[0]:.2f}x" if peer_[0] else "n/a",
                verdict(ours[0] > peer_[0]),
            ]
        )
        table.rows.append(
            [
                f"server CPU per call during the {kind} calls/s row (ms)",
                f"{ours[2]:.2f}",
                f"{peer_[2]:.2f}",
                f"{ours[2] / peer_[2]:.2f}x" if peer_[2] else "n/a",
                "",
            ]
        )
    row(
        "start -> result, 0 s job, Tasks declared: handles' `work_inline` (`task_after` 1 s: the result in "
        "the first response, no task), the peer's task",
        "inline_0",
    )
    row("plain call, 0 s job (no extension: inline on both)", "plain_0", faster=False)
    row("plain call, 100 ms job (no extension: inline on both)", "plain_100", faster=False)
    for label, values in (
        ("handles only: work_start + long-polling work_fetch, 0 s job", handle_0),
        ("handles only: work_start + long-polling work_fetch, 100 ms job", handle_100),
        (
            "handles only: `call_tool` of a 0 s job as an application makes it, through `TasksClientExtension` "
            "(which follows a task to its result): `work`, a task",
            honoured["work"],
        ),
        (
            "handles only: the same call of `work_inline` (`task_after` 1 s: the result in the first response)",
            honoured["work_inline"],
        ),
    ):
        s = Stats.of(values)
        table.data[label] = s.as_dict()
        table.rows.append([label, s.p50_p99, "(no equivalent)", "", ""])
    table.rows.append(
        [
            "server peak RSS (VmHWM) MiB / CPU s over the whole section",
            f"{(memory['handles'][0] or 0) / 1024:.0f} MiB / {memory['handles'][1] or 0:.1f} s",
            f"{(memory['peer'][0] or 0) / 1024:.0f} MiB / {memory['peer'][1] or 0:.1f} s",
            "",
            "",
        ]
    )
    table.notes += [
        f"{samples} samples per latency row ({slow_samples} for the 100 ms rows), alternating the two servers "
        "sample by sample in shuffled order; the client polls `tasks/get` back to back (no pause), so start -> "
        "result measures the servers, not a polling interval (both advertise pollIntervalMs=100).",
        "Start -> result of a 0 s job, task creation, the no-op call and `tasks/get` of a completed task are "
        "measured in the same rounds (each round runs every measure on both servers once, in shuffled order), "
        "so they compare with each other: a task at once takes two requests, so the least its start -> result "
        "can take on a server is about its no-op call plus its `tasks/get`.",
        "The peer runs Docket's defaults (worker concurrency 10, minimum_check_interval 50 ms); its state is in "
        "memory (`memory://`), so it is not durable across a restart, while every handles figure includes its "
        "SQLite commits.",
        "Plain calls: the peer runs the tool inline in the request; handles stores the job, runs it, and answers "
        "its result inline (durable, adaptive plain call).",
        f"calls/s: {workers} clients per server, looping for {window:g} s in all, in {rounds} "
        f"window{'s' if rounds != 1 else ''} of {window / rounds:g} s; the servers take turns window by window "
        "(shuffled each round), never at once. Server CPU per call: the server process's user + system CPU "
        "time over its windows (from /proc) divided by the calls it completed in them; the clients run in "
        "the measuring process, on the same 2 cores.",
    ]
    return [table]
