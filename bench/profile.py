"""Hot paths of `work_progress` and `work_start`: where the time of one call goes.

The views:

1. A breakdown, in-process (Profile A): each layer of the call timed on its own (the handle check,
   one store read with and without the worker-thread hop, the handler `JobTools.*`, the whole MCP
   tool call, the no-op call, the client's output-schema check, and the handler and its read with
   the CPU caches evicted before each call), so the differences show what each layer adds.
2. The progress handler timed inside a stdio server process (Profile E), where the caches are as a
   real server has them.
3. A sampling profile of the server process (py-spy, all threads, CPU only) while one client calls
   the tool back to back over Streamable HTTP (Profile B; also the plain call of the job, `work`), and
   the CPU per call of server and client by owner, over stdio and HTTP (Profile C). Skipped with a note when py-spy is not installed
   (`pip install py-spy`) or cannot attach.
4. The plan and cost of a start's per-principal active count at scale (Profile D).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.common import (
    Options,
    Stats,
    Table,
    client,
    handles_http_server,
    handles_stdio_server,
    inprocess,
    log,
    ms,
    structured,
)

SECTION = "profile"
PRINCIPAL = "local:local"


async def _sample(
    call: Callable[[], Awaitable[Any]], n: int, warmup: int, between: Callable[[], Any] | None = None
) -> Stats:
    """`n` timed calls after `warmup` untimed ones; `between` runs, untimed, before each timed call."""
    for _ in range(warmup):
        await call()
    values = []
    for _ in range(n):
        if between is not None:
            between()
        started = time.perf_counter()
        await call()
        values.append(time.perf_counter() - started)
    return Stats.of(values)


_EVICTION = bytearray(16 * 1024 * 1024)


def _evict_caches() -> int:
    """Touch every cache line of 16 MiB and make some Python objects: what a server's CPU caches hold
    between two calls of one client, once the transport, the SDK and the other process have run."""
    for index in range(0, len(_EVICTION), 64):
        _EVICTION[index] ^= 1
    return len([str(number) for number in range(20_000)])


def _output_checks(schema: dict[str, Any], model: Any, result: dict[str, Any]) -> list[tuple[str, Any]]:
    """The SDK client's check of `result` (`jsonschema`, as `ClientSession.validate_tool_result` makes
    it) against the tool's listed `schema`, and against pydantic's own schema of the same output model
    (nested `$defs` and `anyOf`, as it was before the package published its output schemas flat)."""
    from jsonschema import exceptions as jsonschema_exceptions
    from jsonschema.validators import validator_for
    from pydantic import create_model
    from referencing import Registry

    fields: dict[str, Any] = {name: (field.annotation, field) for name, field in model.model_fields.items()}
    nested = create_model(f"{model.__name__}Nested", **fields).model_json_schema()
    checks = []
    for listed in (schema, nested):
        validator = validator_for(listed)(listed, registry=Registry())

        def check(validator: Any = validator) -> Any:
            assert jsonschema_exceptions.best_match(validator.iter_errors(result)) is None
            return asyncio.sleep(0)

        checks.append(check)
    return [
        (
            "the SDK client's check of a work_progress result against its listed (flat) output schema",
            checks[0],
        ),
        ("the same check against pydantic's own nested schema of the same output model", checks[1]),
    ]


def _held_back(adopt: Callable[..., None]) -> Callable[..., None]:
    """`Runtime.adopt`, called 2 ms later (bench only): the start handler timed with its job surely out of
    its window. Before change 26 asyncio ran the job's first step before the start resumed; since, the job
    lets the start's reply go first, so this row and the handler's should agree (the check that it does)."""

    def later(*args: Any, **kwargs: Any) -> None:
        asyncio.get_running_loop().call_later(0.002, lambda: adopt(*args, **kwargs))

    return later


async def breakdown(options: Options) -> Table:
    import anyio.to_thread

    from handles.server.handle_tools import JobTools

    n = options.n(2000, 150)
    table = options.table(
        SECTION,
        "Profile A. Where one call's time goes (in-process, SQLite file, each layer timed alone)",
        ["layer", "p50 us", "p99 us"],
    )
    data_dir = Path(tempfile.mkdtemp(prefix="profile-", dir=options.work_dir))
    async with inprocess(data_dir) as (jobs, c):
        service = jobs.service
        spec = jobs.specs["work"]
        tools = JobTools(spec, service)
        handle = (await structured(c, "work_start", {"seconds": 3600}))["handle"]
        claims = service.codec.verify(handle, principal=PRINCIPAL)
        assert claims is not None
        job_id = claims.job_id
        repo = service.store.repo
        layers: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
            (
                "HandleCodec.verify (signature + principal tag)",
                lambda: asyncio.sleep(0, service.codec.verify(handle, principal=PRINCIPAL)),
            ),
            (
                "worker-thread hop alone (anyio.to_thread.run_sync of a no-op)",
                lambda: anyio.to_thread.run_sync(lambda: None),
            ),
            (
                "JobRepository.get, called directly (Core SELECT by key, pooled connection)",
                lambda: asyncio.sleep(0, repo.get(job_id)),
            ),
            ("JobRepository.steps, called directly", lambda: asyncio.sleep(0, repo.steps(job_id))),
            ("Store.call(repo.get) (read + thread hop)", lambda: service.store.call(repo.get, job_id)),
            (
                "one write transaction, called directly (JobRepository.touch_abandon_deadline)",
                lambda: asyncio.sleep(0, repo.touch_abandon_deadline(job_id)),
            ),
            (
                "Store.write(repo.touch_abandon_deadline) (write + thread hop + wake)",
                lambda: service.store.write(job_id, "changed", repo.touch_abandon_deadline, job_id),
            ),
            (
                "JobOperations.open (verify + read + keep-alive check)",
                lambda: service.open(spec, PRINCIPAL, handle),
            ),
            (
                "JobTools.progress handler (open + steps + reply model)",
                lambda: tools.progress(PRINCIPAL, {"handle": handle}),
            ),
            (
                "work_progress via mcp.Client in-process (whole tool call)",
                lambda: c.call_tool("work_progress", {"handle": handle}),
            ),
            ("no-op plain tool via mcp.Client in-process", lambda: c.call_tool("noop", {})),
        ]
        from handles.server.tool_shapes import ProgressOutput

        listed = {tool.name: tool for tool in (await c.list_tools()).tools}
        progress_result = await structured(c, "work_progress", {"handle": handle})
        output_schema = listed["work_progress"].output_schema
        assert output_schema is not None
        layers += _output_checks(output_schema, ProgressOutput, progress_result)
        for label, call in layers:
            s = await _sample(call, n, 50)
            table.rows.append([label, f"{s.p50 * 1000:.0f}", f"{s.p99 * 1000:.0f}"])
            table.data[label] = s.as_dict()
        for label, call in (
            (
                "JobTools.progress handler, CPU caches evicted before each call (16 MiB touched, untimed)",
                lambda: tools.progress(PRINCIPAL, {"handle": handle}),
            ),
            (
                "JobRepository.snapshot on the event loop (SQLite's own connection), caches evicted the same way",
                lambda: asyncio.sleep(0, repo.read_inline(repo.snapshot, job_id)),
            ),
            (
                "JobRepository.snapshot on the event loop, caches warm (called back to back)",
                lambda: asyncio.sleep(0, repo.read_inline(repo.snapshot, job_id)),
            ),
        ):
            cold = "evicted" in label
            s = await _sample(call, n // 2 if cold else n, 50, _evict_caches if cold else None)
            table.rows.append([label, f"{s.p50 * 1000:.0f}", f"{s.p99 * 1000:.0f}"])
            table.data[label] = s.as_dict()
        starts = options.n(400, 60)
        start_rows = (
            ("JobTools.start handler (validate + insert + handle + submit)", "handler"),
            (
                "JobTools.start handler, the job's run held back 2 ms (bench only: its first step out of the window)",
                "held",
            ),
            ("work_start via mcp.Client in-process (whole tool call)", "mcp"),
        )
        started: dict[str, list[float]] = {key: [] for _, key in start_rows}
        runtime = service.runtime
        adopt = runtime.adopt
        for index in range(starts + 10):
            for _, key in start_rows:  # interleaved, so the rows share the host's moment
                began = time.perf_counter()
                if key == "mcp":
                    handle_ = (await structured(c, "work_start", {"seconds": 0}))["handle"]
                else:
                    if key == "held":
                        runtime.adopt = _held_back(adopt)  # type: ignore[method-assign]
                    try:
                        handle_ = (await tools.start(PRINCIPAL, {"seconds": 0})).structured["handle"]
                    finally:
                        runtime.adopt = adopt  # type: ignore[method-assign]
                elapsed = time.perf_counter() - began
                await structured(c, "work_fetch", {"handle": handle_, "wait_seconds": 10})  # untimed
                if index >= 10:
                    started[key].append(elapsed)
        for label, key in start_rows:
            s = Stats.of(started[key])
            table.rows.append([label, f"{s.p50 * 1000:.0f}", f"{s.p99 * 1000:.0f}"])
            table.data[label] = s.as_dict()
    table.notes += [
        "p50 and p99 in microseconds, each layer measured alone on the same server instance; subtract "
        "neighbouring rows to see what a layer adds.",
        "Start rows: each start of a 0 s job is timed alone; the job is then awaited (untimed) so starts do not "
        "overlap. The three start rows take turns in one loop. The held-back row hands the stored job to the "
        "runtime 2 ms later (a bench-only wrapper of `Runtime.adopt`): the handler with its job surely out of "
        "its window. Before change 26 asyncio ran the job's first step (for a 0 s job, its whole run up to the "
        "outcome write) before the start resumed, and the difference of the two rows was that step; since, the "
        "job lets the start's reply go first, and the two rows agree.",
        "Output-schema rows: the check the official client makes of every structured result (`jsonschema`, "
        "compiled once, `best_match` over `iter_errors`), of one real `work_progress` result, against the schema "
        "`tools/list` gives (flat: `handles.server.output_schema`) and against pydantic's own nested schema of "
        "the same model.",
        "Evicted rows: before each timed call, 16 MiB are touched and 20,000 small strings made (untimed), "
        "as the transport, the SDK and the client process do between two calls of a real server; the warm "
        "rows call back to back. The handler's figure inside the stdio server process is in "
        "docs/performance.md.",
    ]
    return table


# -- sampling profile ---------------------------------------------------------------------

LIBRARIES = (
    ("handles (package code, self time)", r"^handles/"),
    ("sqlite3 driver calls (execute, commit, rollback)", r"^sqlalchemy/engine/default\.py:(?:\d+)$", "do_"),
    ("sqlalchemy (ORM, sessions, SQL compilation)", r"^sqlalchemy/|^<sqlalchemy"),
    ("sqlmodel", r"^sqlmodel/"),
    ("pydantic / pydantic_core (validation, dumps)", r"^pydantic"),
    ("mcp SDK (server, types)", r"^mcp/|^mcp_types/"),
    ("jsonschema / referencing", r"^jsonschema|^referencing"),
    ("HTTP (starlette, uvicorn, sse-starlette, h11)", r"^starlette|^uvicorn|^sse_starlette|^h11|^httptools"),
    ("itsdangerous / hmac / hashlib (handle signing)", r"^itsdangerous|^hmac|^hashlib"),
    (
        "anyio / asyncio / threading (scheduling, thread hops)",
        r"^anyio/|^asyncio/|^threading|^selectors|^queue|^concurrent/",
    ),
    ("json", r"^json/"),
)
IDLE = ("Condition.wait", "EpollSelector.select", "Event.wait", "Thread.join", "Queue.get", "sleep")
_FRAME = re.compile(r"^(?P<name>.*) \((?P<path>.*?)(?::(?P<line>\d+))?\)$")


def _split(frame: str) -> tuple[str, str]:
    match = _FRAME.match(frame)
    if match is None:
        return frame, ""
    path = match.group("path")
    path = re.sub(r"^.*/(?:site-packages|lib/python3\.\d+)/", "", path)
    path = re.sub(r"^.*?/(handles|bench)/", r"\1/", path)
    return match.group("name"), path


def _category(frames: list[str]) -> str:
    name, path = _split(frames[-1])
    for entry in LIBRARIES:
        label, pattern = entry[0], entry[1]
        if len(entry) == 3:
            if path.startswith("sqlalchemy/engine/default.py") and name.split(".")[-1].startswith(entry[2]):
                return label
            continue
        if re.search(pattern, path):
            return label
    return "other (stdlib, typing, logging, ...)"


def _aggregate(raw: Path) -> tuple[int, collections.Counter[str], collections.Counter[str]]:
    total = 0
    categories: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")[1:]  # the first entry names the thread
        if not frames or _split(frames[-1])[0].split(".")[-1] in {i.split(".")[-1] for i in IDLE}:
            continue
        total += n
        categories[_category(frames)] += n
        seen: set[str] = set()
        for frame in frames:
            name, path = _split(frame)
            if not path.startswith("handles/"):
                continue
            key = f"{name} ({path})"
            if key not in seen:
                seen.add(key)
                own[key] += n
    return total, categories, own


async def sampled(options: Options) -> list[Table]:
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    tables: list[Table] = []
    seconds = options.n(12, 2)
    for tool in ("work_progress", "work_start", "work"):
        what = "plain `work` calls of a 0 s job (answered inline)" if tool == "work" else f"{tool} calls"
        table = options.table(
            SECTION,
            f"Profile B. Sampling profile of the server during back-to-back {what} (Streamable HTTP, SQLite file)",
            ["where the server's CPU samples are", "share"],
        )
        tables.append(table)
        if spy is None:
            table.rows.append(["py-spy is not installed", "n/a"])
            table.notes.append(
                "Install py-spy (`pip install py-spy`) into the environment to get this table."
            )
            continue
        data_dir = Path(tempfile.mkdtemp(prefix=f"spy-{tool}-", dir=options.work_dir))
        server = handles_http_server(data_dir).start()
        raw = data_dir / "py-spy.txt"
        calls = 0
        try:
            async with client(server.url, tasks=False) as c:
                running = (await structured(c, "work_start", {"seconds": 3600}))["handle"]
                for _ in range(50):
                    await c.call_tool("work_progress", {"handle": running})
                recorder = subprocess.Popen(
                    [
                        spy,
                        "record",
                        "-p",
                        str(server.pid),
                        "-d",
                        str(seconds),
                        "-r",
                        "1000",
                        "--threads",
                        "--idle",
                        "-f",
                        "raw",
                        "-o",
                        str(raw),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
                deadline = time.perf_counter() + seconds + 1
                while time.perf_counter() < deadline and recorder.poll() is None:
                    if tool == "work_progress":
                        await structured(c, "work_progress", {"handle": running})
                    elif tool == "work":
                        await structured(c, "work", {"seconds": 0})
                    else:
                        data = await structured(c, "work_start", {"seconds": 0})
                        await structured(c, "work_fetch", {"handle": data["handle"], "wait_seconds": 10})
                    calls += 1
                _, error = await asyncio.to_thread(recorder.communicate)
        finally:
            server.stop()
        if not raw.exists():
            table.rows.append(["py-spy could not record", "n/a"])
            table.notes.append(f"py-spy: {error.decode(errors='replace').strip()[-300:]}")
            continue
        total, categories, own = _aggregate(raw)
        table.data = {"samples": total, "calls": calls, "categories": dict(categories), "handles": dict(own)}
        for label, count in categories.most_common():
            table.rows.append([f"leaf in {label}", f"{count / total:.0%}"])
        for name, count in own.most_common(12):
            table.rows.append([f"inclusive: `{name}`", f"{count / total:.0%}"])
        table.notes += [
            f"{total} CPU samples at 1000 Hz over {seconds} s, all threads (the event loop and the store's worker "
            f"threads), waiting frames (lock, selector and queue waits) excluded; {calls} calls"
            + (
                " (each start followed by a long-polling fetch, so the job's claim and outcome writes are included)"
                if tool == "work_start"
                else ""
            )
            + ".",
            "`leaf in X`: the share of samples whose innermost frame is in X (self time by library); "
            "`inclusive`: the share of samples with that package function anywhere on the stack.",
        ]
    return tables


# -- CPU per call by owner, against the no-op ------------------------------------------------------

OWNERS = (
    ("handles: store (SQL, handles/store)", r"^handles/store/"),
    ("handles: the rest (tools, handle, service, runtime)", r"^handles/"),
    ("MCP SDK (mcp, mcp_types: sessions, validation, JSON-RPC)", r"^mcp/|^mcp_types/"),
    (
        "transport (starlette, uvicorn, h11, httpx2; anyio streams and file I/O)",
        r"^starlette|^uvicorn|^sse_starlette|^h11|^httptools|^httpx|^httpcore|^anyio/streams|^anyio/_core/_fileio",
    ),
    ("bench loop", r"^bench/"),
)
OWNED_ELSEWHERE = "event loop and the rest (asyncio, gc, stdlib)"
OWNER_CALLS = ("noop", "progress_shaped", "work_progress", "work_start")


def _owner(frames: list[str]) -> str:
    """The innermost frame that belongs to the package, the SDK, the transport or the bench loop decides
    who asked for a sample's work: pydantic validating a tool's output under `mcp/` is the SDK's, a
    SQLite call under `handles/store/` is the store's."""
    for frame in reversed(frames):
        path = _split(frame)[1]
        for label, pattern in OWNERS:
            if re.search(pattern, path):
                return label
    return OWNED_ELSEWHERE


def _owned(raw: Path) -> collections.Counter[str]:
    """The busy samples of one py-spy record (every thread), by owner."""
    owners: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")[1:]
        if not frames or _split(frames[-1])[0].split(".")[-1] in {i.split(".")[-1] for i in IDLE}:
            continue
        owners[_owner(frames)] += n
    return owners


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


async def owners(options: Options) -> list[Table]:
    """CPU per call of the server and of the client, by owner, for the no-op, `work_progress` and
    `work_start`, over stdio and Streamable HTTP: what a call adds to the no-op, and who spends it."""
    import os

    from tests.harness.process import cpu_seconds

    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    seconds = options.n(10, 3)
    rate = 250  # blocking samples (consistent stacks); a low rate keeps the pauses small
    tables: list[Table] = []
    for transport in ("stdio", "http"):
        table = options.table(
            SECTION,
            f"Profile C. CPU per call by owner, against the no-op ({transport}, SQLite file)",
            [
                "owner",
                *[f"server {call} ms" for call in OWNER_CALLS],
                *[f"client {call} ms" for call in OWNER_CALLS],
            ],
        )
        tables.append(table)
        if spy is None:
            table.rows.append(["py-spy is not installed", *["n/a"] * 6])
            continue
        data_dir = Path(tempfile.mkdtemp(prefix=f"owners-{transport}-", dir=options.work_dir))
        per_call: dict[str, dict[str, dict[str, float]]] = {"server": {}, "client": {}}
        latency: dict[str, float] = {}
        server: Any = None
        async with contextlib.AsyncExitStack() as stack:
            if transport == "stdio":
                before = set(_children(os.getpid()))
                params = handles_stdio_server(data_dir)
                c = await stack.enter_async_context(client(params))
                new = [pid for pid in _children(os.getpid()) if pid not in before]
                server_pid = new[0]
            else:
                server = handles_http_server(data_dir).start()
                stack.callback(server.stop)
                c = await stack.enter_async_context(client(server.url))
                server_pid = server.pid
            running = (await structured(c, "work_start", {"seconds": 3600}))["handle"]
            calls_of: dict[str, tuple[str, dict[str, Any]]] = {
                "noop": ("noop", {}),
                "progress_shaped": ("progress_shaped", {}),
                "work_progress": ("work_progress", {"handle": running}),
                "work_start": ("work_start", {"seconds": 0}),
            }
            for call in OWNER_CALLS:
                for _ in range(100):
                    await c.call_tool(*calls_of[call])
                raws = {side: data_dir / f"{transport}-{call}-{side}.txt" for side in ("server", "client")}
                recorders = [
                    subprocess.Popen(
                        [
                            spy,
                            "record",
                            "-p",
                            str(pid),
                            "-d",
                            str(seconds),
                            "-r",
                            str(rate),
                            "--threads",
                            "-f",
                            "raw",
                            "-o",
                            str(raws[side]),
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                    )
                    for side, pid in (("server", server_pid), ("client", os.getpid()))
                ]
                await asyncio.sleep(0.5)  # both recorders attached
                times: list[float] = []
                cpu_before = {"server": cpu_seconds(server_pid), "client": cpu_seconds(os.getpid())}
                deadline = time.perf_counter() + seconds - 1
                while time.perf_counter() < deadline:
                    began = time.perf_counter()
                    await c.call_tool(*calls_of[call])
                    times.append(time.perf_counter() - began)
                cpu_after = {"server": cpu_seconds(server_pid), "client": cpu_seconds(os.getpid())}
                for recorder in recorders:
                    await asyncio.to_thread(recorder.communicate)
                latency[call] = Stats.of(times).p50
                for side, raw in raws.items():
                    start_cpu, end_cpu = cpu_before[side], cpu_after[side]
                    if not raw.exists() or start_cpu is None or end_cpu is None:
                        continue
                    busy = _owned(raw)
                    samples = sum(busy.values()) or 1
                    cpu_ms = (end_cpu - start_cpu) / len(times) * 1000  # the process's CPU time per call
                    per_call[side][call] = {owner: cpu_ms * count / samples for owner, count in busy.items()}
            if transport == "stdio":
                await c.call_tool("work_cancel", {"handle": running})
        labels = [label for label, _ in OWNERS] + [OWNED_ELSEWHERE]
        for label in labels:
            row = [label]
            for side in ("server", "client"):
                for call in OWNER_CALLS:
                    value = per_call[side].get(call, {}).get(label, 0.0)
                    row.append(f"{value:.3f}")
            table.rows.append(row)
        totals = ["all CPU"]
        for side in ("server", "client"):
            for call in OWNER_CALLS:
                totals.append(f"{sum(per_call[side].get(call, {}).values()):.3f}")
        table.rows.append(totals)
        table.rows.append(
            [
                "call latency p50 ms (recorders attached)",
                *[f"{latency[c_]:.3f}" for c_ in OWNER_CALLS],
                *[""] * len(OWNER_CALLS),
            ]
        )
        table.data = {"per_call_ms": per_call, "latency_p50_ms": latency, "seconds": seconds, "rate_hz": rate}
        table.notes += [
            f"py-spy at {rate} Hz, all threads, on the server process and on the measuring (client) "
            f"process at once, while the client calls one tool back to back for {seconds - 1} s (after 100 "
            "warm-up calls). CPU per call: the process's CPU time (utime + stime) over the loop / calls, shared "
            "out by the owners of its busy samples (threads the OS reports idle are not sampled; waiting frames "
            "excluded).",
            "Owner: the innermost frame of a sample in the package (split into `handles/store` and the rest), the "
            "MCP SDK (`mcp`, `mcp_types`), the transport, or the bench loop; pydantic, jsonschema and json work "
            "count for whichever of those called it. `work_start` starts a 0 s job: the server's figure includes "
            "running it and storing its outcome (what each start costs the server), as in section 1, where each "
            "started job is awaited untimed.",
            "`progress_shaped` (section 1): an SDK tool that runs no package code and returns a prebuilt result of "
            "`work_progress`'s size and output schema; like the no-op it is a sync function, which the SDK runs on "
            "a worker thread (the handle tools are async and run on the event loop).",
        ]
    return tables


# -- the per-principal active count at scale --------------------------------------------------


async def active_count(options: Options) -> Table:
    """Why work_start slows down as the store grows: the plan and cost of the per-principal active count."""
    import sqlite3

    from tests.harness.seed import seed_jobs

    size = options.n(300_000, 20_000)
    table = options.table(
        SECTION,
        f"Profile D. The per-principal active-job count of work_start, SQLite file with {size:,} stored "
        "jobs of one principal",
        ["query", "plan", "p50 ms"],
    )
    data_dir = Path(tempfile.mkdtemp(prefix="count-", dir=options.work_dir))
    url = f"sqlite:///{(data_dir / 'handles.db').as_posix()}"
    async with inprocess(data_dir, url):
        pass
    seed_jobs(url, size)
    from handles.store.models import principal_key

    query = (
        f"SELECT count(*) FROM handles_jobs WHERE principal_key = '{principal_key('local:local')}' "
        "AND status IN ('working', 'input_required')"
    )
    for label, change in (
        ("as work_start runs it (schema as shipped)", None),
        ("without the (principal_key, status) index", "DROP INDEX ix_handles_jobs_principal_key_status"),
    ):
        if change:
            with contextlib.closing(sqlite3.connect(data_dir / "handles.db")) as changing:
                changing.execute(change)
                changing.commit()
        # A connection of its own per variant: one prepared before the change keeps its old plan.
        with contextlib.closing(sqlite3.connect(data_dir / "handles.db")) as connection:
            plan = "; ".join(str(row[-1]) for row in connection.execute("EXPLAIN QUERY PLAN " + query))
            values = []
            for _ in range(5):
                began = time.perf_counter()
                connection.execute(query).fetchall()
                values.append(time.perf_counter() - began)
        s = Stats.of(values)
        table.rows.append([label, f"`{plan}`", ms(s.p50)])
        table.data[label] = {"plan": plan, **s.as_dict()}
    table.notes.append(
        "`JobRepository.insert` counts the principal's active jobs (for `max_active_per_principal`) in the insert's "
        "write transaction. Before migration 0003 the only usable index was on `principal` (70 ms for this count "
        "at 300,000 jobs in the first run of this suite); the shipped schema has an index on (principal_key, status), "
        "where `principal_key` is the SHA-256 of the principal (migration 0004)."
    )
    return table


async def inside_server(options: Options) -> Table:
    """The progress handler and its store read timed inside a stdio server process (cold caches between
    calls, as a real server has them), against the same timed in-process back to back (warm)."""
    import json

    n = options.n(1000, 100)
    table = options.table(
        SECTION,
        "Profile E. The work_progress handler timed inside the server process (stdio, SQLite file)",
        ["measure", "n", "p50 us", "p90 us", "p99 us"],
    )
    data_dir = Path(tempfile.mkdtemp(prefix="inside-", dir=options.work_dir))
    times = data_dir / "handler-times.json"
    params = handles_stdio_server(data_dir, BENCH_HANDLER_TIMES=str(times))
    async with client(params) as c:
        running = (await structured(c, "work_start", {"seconds": 3600}))["handle"]
        for _ in range(100 + n):
            await c.call_tool("work_progress", {"handle": running})
        await c.call_tool("work_cancel", {"handle": running})
    samples: dict[str, list[float]] = json.loads(times.read_text())
    for measure, values in samples.items():
        kept = values[100 : 100 + n]  # after 100 warm-up calls
        s = Stats.of([value / 1e6 for value in kept])  # microseconds, given to Stats in seconds
        table.rows.append(
            [
                f"inside the stdio server: {measure}",
                str(len(kept)),
                f"{s.p50 * 1000:.0f}",
                f"{s.p90 * 1000:.0f}",
                f"{s.p99 * 1000:.0f}",
            ]
        )
        table.data[measure] = s.as_dict()
    table.notes += [
        f"`python -m bench.app --stdio` with `BENCH_HANDLER_TIMES` set: `JobTools.progress` and "
        "`JobRepository.snapshot` wrapped with `time.perf_counter` (wall) and `time.thread_time` (the event "
        f"loop thread's CPU), while one client calls `work_progress` of a running job back to back over stdio "
        f"({n} calls after 100 warm-up calls).",
        "Compare Profile A's `JobTools.progress handler` and `JobRepository.snapshot` rows: the same code timed "
        "in-process back to back (warm caches) and with the caches evicted before each call.",
    ]
    return table


async def run(options: Options) -> list[Table]:
    log("profile: breakdown")
    tables = [await breakdown(options)]
    log("profile: the progress handler inside the server process")
    tables.append(await inside_server(options))
    log("profile: per-principal active count")
    tables.append(await active_count(options))
    log("profile: sampling (py-spy)")
    tables += await sampled(options)
    log("profile: CPU per call by owner (py-spy)")
    tables += await owners(options)
    return tables
