"""The stdout of `serve_stdio`: messages written from the event loop when the pipe has room, never interleaved."""

from __future__ import annotations

import os
import select
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import anyio
from mcp.server.stdio import _claim_fd, _open_stdout_diversion  # the SDK's own claim of fd 1 (private)

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
    """The wire's descriptor while fd 1 is claimed as the SDK's `stdio_server` claims it; None where that cannot be done."""
    if sys.platform == "win32":
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
