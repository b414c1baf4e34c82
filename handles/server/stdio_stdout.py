"""The stdout of `serve_stdio`: every message written from the event loop, never behind a job's step.

The SDK's `stdio_server` writes each message with `anyio.wrap_file`: the write, then the flush, each on a
worker thread. A worker thread needs the GIL to run, and the event loop holds it while it runs Python, so a
reply handed to that thread waits for whatever the loop runs next: a started job's first step, which may be
long (a CPU-bound job holds the GIL until it awaits). docs/performance.md ("`J_start` over stdio") measures
what that costs every start.

`LoopStdout` writes a message from the event loop itself, in pieces of at most `select.PIPE_BUF` bytes, each
only once `poll` says the pipe has room for it: a piece that size is taken whole by a pipe with room, so no
write blocks the loop. When the pipe is full (the client is not reading) or a message has put
`LOOP_BYTES` on the loop already, the rest of the message goes to a worker thread, and the next message
waits for it: messages never interleave or change order.

It needs fd 1 to itself, claimed as the SDK claims it (`claimed_stdout`): the wire moves to a private
duplicate and fd 1 points at stderr while serving, so a stray `print` misses the wire. Where fd 1 cannot be
claimed so (`sys.stdout` is not fd 1, Windows, no descriptor to spare), the SDK's own stdout serves.
"""

from __future__ import annotations

import os
import select
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import anyio

PIECE_BYTES = getattr(select, "PIPE_BUF", 512)
"""The most one write on the loop puts into the pipe: a pipe with any room takes this much whole (POSIX)."""

LOOP_BYTES = 64 * 1024
"""The most of one message written on the loop; the rest of a larger one goes to a worker thread."""

_claim_lock = threading.Lock()
_claimed = False


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
    """The wire's private descriptor while fd 1 points at stderr, as the SDK's `stdio_server` claims fd 1 (its
    `_claim_fd`); None when fd 1 cannot be claimed so, and the SDK's own stdout then serves. On exit the wire
    is put back on fd 1. The private descriptor is never closed: a worker thread may still be writing to it."""
    global _claimed
    if sys.platform == "win32" or not _backed_by(sys.stdout, 1):
        yield None
        return
    with _claim_lock:
        if _claimed:
            raise RuntimeError("another serve_stdio() in this process has already claimed fd 1")
        _claimed = True
    try:
        private = _divert_stdout()
        try:
            yield private
        finally:
            if private is not None:
                os.dup2(private, 1)
    finally:
        with _claim_lock:
            _claimed = False


def _divert_stdout() -> int | None:
    """A close-on-exec duplicate of fd 1 above the standard range, with fd 1 then pointing at stderr (or the
    null device); None, and fd 1 untouched, when either cannot be made."""
    import fcntl

    try:
        private = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    except OSError:
        return None
    try:
        diversion = os.dup(2)
    except OSError:
        try:
            diversion = os.open(os.devnull, os.O_WRONLY)
        except OSError:
            os.close(private)
            return None
    try:
        os.dup2(diversion, 1)
    except OSError:
        os.close(private)
        return None
    finally:
        with suppress(OSError):
            os.close(diversion)
    return private


def _backed_by(stream: Any, fd: int) -> bool:
    try:
        return bool(stream.buffer.fileno() == fd)
    except (AttributeError, OSError, ValueError):
        return False
