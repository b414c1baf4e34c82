"""The stdout of `serve_stdio`: every message written from the event loop, never behind a job's step.

The SDK's `stdio_server` writes each message with `anyio.wrap_file`: the write, then the flush, each on a
worker thread. A worker thread needs the GIL to run, and the event loop holds it while it runs Python, so a
reply handed to that thread waits for whatever the loop runs next: a started job's first step, which may be
long (a CPU-bound job holds the GIL until it awaits). docs/performance.md measures
what that costs every start.

`LoopStdout` writes a message from the event loop itself, in pieces of at most `select.PIPE_BUF` bytes, each
only once `poll` says the pipe has room for it: a piece that size is taken whole by a pipe with room, so no
write blocks the loop. When the pipe is full (the client is not reading) or a message has put
`LOOP_BYTES` on the loop already, the rest of the message goes to a worker thread, and the next message
waits for it: messages never interleave or change order.

It needs fd 1 to itself, claimed by the SDK's own claim (`claimed_stdout`, which `stdio_server` skips for a
stdout it is given): the wire moves to a private duplicate and fd 1 points at stderr while serving, so a
stray `print` misses the wire. Where `sys.stdout` is not fd 1, or on Windows, the SDK's own stdout serves.
"""

from __future__ import annotations

import os
import select
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import anyio

try:  # the SDK's own claim of fd 1 (private to `mcp.server.stdio`; an SDK without it serves stdio itself)
    from mcp.server.stdio import _claim_fd, _open_stdout_diversion
except ImportError:  # pragma: no cover
    _claim_fd = None  # type: ignore[assignment]

PIECE_BYTES = getattr(select, "PIPE_BUF", 512)
"""The most one write on the loop puts into the pipe: a pipe with any room takes this much whole (POSIX)."""

LOOP_BYTES = 64 * 1024
"""The most of one message written on the loop; the rest of a larger one goes to a worker thread."""


class LoopStdout:
    """The `stdout` that `stdio_server` takes (`await write(text)`, `await flush()`), written on the loop."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._poll = select.poll()
        self._poll.register(fd, select.POLLOUT)

    async def write(self, text: str) -> int:
        data = memoryview(text.encode("utf-8"))
        sent = 0
        while sent < len(data) and sent < LOOP_BYTES and self._poll.poll(0):
            sent += os.write(self._fd, data[sent : sent + PIECE_BYTES])
        if sent < len(data):
            await anyio.to_thread.run_sync(write_all, self._fd, data[sent:])
        return len(text)

    async def flush(self) -> None:
        """Nothing is buffered: every write is in the pipe when it returns."""


def write_all(fd: int, data: memoryview) -> None:
    """Write all of `data` to `fd`, blocking while the pipe is full (on a worker thread)."""
    while data:
        data = data[os.write(fd, data) :]


@contextmanager
def claimed_stdout() -> Iterator[int | None]:
    """The wire's descriptor while fd 1 is claimed by the SDK's own `_claim_fd`, as its `stdio_server` claims
    fd 1 for itself (a private duplicate for the wire, fd 1 pointed at stderr, put back on exit; a second
    claim in this process refused, by the SDK or by `serve_stdio`); None on Windows (no `poll` of a pipe),
    when `sys.stdout` is not fd 1, or with an SDK that has no such function: the SDK's own stdout then
    serves."""
    if _claim_fd is None or sys.platform == "win32":
        yield None
        return
    wire, release = _claim_fd(1, sys.stdout, "wb", _open_stdout_diversion)
    if release is None:  # sys.stdout is not fd 1: not ours to claim
        yield None
        return
    try:
        yield wire.fileno()
    finally:
        release()
