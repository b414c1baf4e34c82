"""`serve_stdio` writes stdout from the event loop (handles/server/stdio_stdout.py).

Against real processes (`python -m tests.integration.stdio_app`, through the official client and as raw
JSON-RPC lines) and real pipes: a start's reply leaves before its job's first step however long that step
holds the GIL; a message the pipe cannot take waits on a worker thread while the loop serves on, and arrives
whole and in order; and fd 1 is claimed as the SDK claims it (stray output misses the wire, and the wire is
back on fd 1 once serving ends).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.session import ClientRequestContext
from mcp_types import ElicitRequestParams, ElicitResult

from handles.client.tasks import TasksClientExtension
from handles.server import stdio_stdout
from handles.server.stdio_stdout import LOOP_BYTES, LoopStdout
from tests.harness.process import REPO_ROOT, server_env
from tests.integration.stdio_app import AFTER_SERVING, STRAY_PRINT, STRAY_WRITE
from tests.support import connect, example_env, new_key, stdio_params

HOG_SECONDS = 4.0
"""How long the `hog` job's first step holds the GIL: a reply that waited for it would take this long."""


def app_env(data_dir: Path) -> dict[str, str]:
    return server_env(data_dir, HANDLES_SECRET_KEYS=new_key())


async def test_a_starts_reply_over_stdio_does_not_wait_for_its_jobs_first_step(tmp_path: Path) -> None:
    """The job's first step holds the GIL for 4 s; its start's reply is out long before (the SDK's stdout
    writer, a worker thread, needs the GIL to write it, and got it only once the step ended)."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "tests.integration.stdio_app"],
        env=app_env(tmp_path),
        cwd=REPO_ROOT,
    )
    async with connect(params) as client:
        await client.call("hog_start", {"seconds": 0.0})  # the process warmed up: imports, schema, first job
        began = time.monotonic()
        started = await client.call("hog_start", {"seconds": HOG_SECONDS})
        replied = time.monotonic() - began
        assert replied < HOG_SECONDS / 2, f"the start's reply took {replied:.2f} s"
        done = await client.call("hog_fetch", {"handle": started.data["handle"], "wait_seconds": 30})
        assert done.data["status"] == "completed", done.data
        assert done.data["result"] == {"held": HOG_SECONDS}


async def approve(_context: ClientRequestContext, _params: ElicitRequestParams) -> ElicitResult:
    return ElicitResult(action="accept", content={"approve": True, "environment": "staging"})


@pytest.mark.parametrize(
    ("mode", "version", "tasks"),
    [
        ("legacy", "2025-11-25", False),
        ("2026-07-28", "2026-07-28", False),
        ("2026-07-28", "2026-07-28", True),
    ],
)
async def test_the_official_client_over_stdio_in_every_mode(
    tmp_path: Path, mode: str, version: str, tasks: bool
) -> None:
    """The example server (`MCPServer`) over stdio, written from the loop, to the official client in handshake
    mode, in 2026-07-28 mode, and declaring the Tasks extension (which follows a task, and answers a question
    through `tasks/update`)."""
    options: dict[str, Any] = (
        {"extensions": [TasksClientExtension()], "elicitation_callback": approve} if tasks else {}
    )
    params = stdio_params(example_env(tmp_path, [new_key()]))
    async with Client(params, mode=mode, read_timeout_seconds=60, **options) as client:
        assert client.protocol_version == version
        report = await client.call_tool("generate_report", {"account": "acme", "months": 2})
        assert report.structured_content is not None and report.structured_content["months"] == 2
        deployed = await client.call_tool("deploy_release", {"version": "1.0.0"})
        assert deployed.structured_content is not None
        if tasks:
            assert deployed.structured_content["environment"] == "staging"
        else:
            assert deployed.structured_content["status"] == "input_required"
            await client.call_tool("deploy_release_cancel", {"handle": deployed.structured_content["handle"]})


def test_stray_output_misses_the_wire_and_the_wire_is_back_on_fd_1_after_serving(tmp_path: Path) -> None:
    requests = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "stray", "arguments": {}}},
    ]
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.stdio_app"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=app_env(tmp_path),
        cwd=REPO_ROOT,
    )
    try:
        assert process.stdin is not None and process.stdout is not None and process.stderr is not None
        process.stdin.write(b"".join(json.dumps(request).encode() + b"\n" for request in requests))
        process.stdin.flush()
        replies = [json.loads(process.stdout.readline()) for _ in range(2)]
        process.stdin.close()  # serving ends
        after = process.stdout.read().decode()
        errors = process.stderr.read().decode()
        process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
    assert [reply["id"] for reply in replies] == [1, 2]
    assert replies[1]["result"]["structuredContent"] == {"result": "quiet"}
    assert STRAY_PRINT in errors and STRAY_WRITE in errors  # on stderr, not on the wire
    assert after == AFTER_SERVING + "\n"  # everything on stdout after the replies: the wire is fd 1 again
    assert process.returncode == 0


async def test_a_message_the_pipe_cannot_take_waits_off_the_loop_and_arrives_whole_and_in_order() -> None:
    """Nobody reads the pipe while a message of 1 MiB is written: the loop keeps turning meanwhile; once the
    reader reads, that message and the three after it arrive whole, in order."""
    read_fd, write_fd = os.pipe()
    messages = ["x" * (1 << 20) + "\n"] + [json.dumps({"n": n}) + "\n" for n in range(3)]
    stdout = LoopStdout(write_fd)
    received = bytearray()
    reading = threading.Event()
    woken_by_the_loop: list[bool] = []

    def reader() -> None:
        # A writer that blocked the loop would never let it say so: the reader then reads after 10 s anyway.
        woken_by_the_loop.append(reading.wait(10))
        while chunk := os.read(read_fd, 1 << 16):
            received.extend(chunk)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        async with anyio.create_task_group() as tg:

            async def write_them() -> None:
                for message in messages:
                    await stdout.write(message)
                    await stdout.flush()

            tg.start_soon(write_them)
            for _ in range(200):  # the loop turns while the pipe is full
                await anyio.sleep(0.001)
            reading.set()
    finally:
        os.close(write_fd)
        reading.set()
        thread.join(30)
        os.close(read_fd)
    assert woken_by_the_loop == [True]
    assert received.decode() == "".join(messages)


async def test_messages_a_pipe_has_room_for_are_written_on_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a reader keeping up, a stream of replies of a few KiB never goes to a worker thread; a message over
    `LOOP_BYTES` hands its rest to one."""
    handed: list[int] = []
    real_write_all = stdio_stdout.write_all

    def write_all(fd: int, data: Any) -> None:
        handed.append(len(data))
        real_write_all(fd, data)

    monkeypatch.setattr(stdio_stdout, "write_all", write_all)
    read_fd, write_fd = os.pipe()
    received = bytearray()

    def reader() -> None:
        while chunk := os.read(read_fd, 1 << 16):
            received.extend(chunk)

    thread = threading.Thread(target=reader)
    thread.start()
    stdout = LoopStdout(write_fd)
    messages = [json.dumps({"n": n, "pad": "y" * 3000}) + "\n" for n in range(200)]
    try:
        for message in messages:
            await stdout.write(message)
            while len(received) < sum(map(len, messages[: messages.index(message) + 1])):
                await anyio.sleep(0.0005)  # the reader keeps up: each message is read before the next
        assert handed == []
        large = "z" * (4 * LOOP_BYTES) + "\n"
        await stdout.write(large)
    finally:
        os.close(write_fd)
        thread.join(30)
        os.close(read_fd)
    assert len(handed) == 1 and 0 < handed[0] <= len(large) - LOOP_BYTES
    assert received.decode() == "".join(messages) + large
