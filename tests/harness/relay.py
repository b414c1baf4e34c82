"""A TCP relay between clients and a server, or between a server and PostgreSQL, that cuts connections
on cue and scans every byte the server sends.

- `Relay`: `up()` accepts, `down()` refuses and aborts every open connection (an outage). With
  `http=True`, `fault()` arms a one-shot cut for the next request whose head matches: refuse it before
  the server sees it, cut it as soon as the server starts answering, or let the server finish and
  swallow its answer. Every byte the server sends goes through the `WireScanner`, when there is one.
  With `http=False` it relays raw bytes (PostgreSQL's protocol): `database_url()` points a URL at it.
- `WireScanner`: looks for configured secrets (signing keys, bearer tokens, a database password),
  `Traceback` and server source paths in every response, across chunk boundaries.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import make_url

from tests.harness.process import free_port

FaultAction = Literal["refuse", "cut_at_first_byte", "cut_after_reply"]


# -- scanning what the server sends ---------------------------------------------------------------


class WireScanner:
    """Finds forbidden strings in a byte stream fed in chunks (a match may straddle two chunks)."""

    def __init__(self) -> None:
        self.forbidden: dict[str, bytes] = {}
        self.hits: list[tuple[str, str]] = []
        self.bytes_scanned = 0
        self.chunks = 0
        self._tails: dict[int, bytes] = {}
        self._lock = threading.Lock()

    def forbid(self, label: str, value: str) -> None:
        if value:
            self.forbidden[label] = value.encode()

    def feed(self, stream: int, chunk: bytes) -> None:
        with self._lock:
            self.chunks += 1
            self.bytes_scanned += len(chunk)
            window = self._tails.get(stream, b"") + chunk
            for label, needle in self.forbidden.items():
                at = window.find(needle)
                if at >= 0:
                    context = window[max(0, at - 80) : at + len(needle) + 80]
                    self.hits.append((label, context.decode(errors="replace")))
            longest = max((len(n) for n in self.forbidden.values()), default=1)
            self._tails[stream] = window[-longest:]

    def close(self, stream: int) -> None:
        with self._lock:
            self._tails.pop(stream, None)


# -- the relay ------------------------------------------------------------------------------------


@dataclass
class Fault:
    match: bytes
    action: FaultAction
    times: int = 1
    fired: int = 0


@dataclass(eq=False)
class _Connection:
    ident: int
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    armed: FaultAction | None = None
    awaiting_head: bool = True
    head: bytes = b""
    swallowed: bytes = b""


@dataclass
class RelayStats:
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    cuts: list[tuple[str, FaultAction]] = field(default_factory=list)


class Relay:
    """A TCP relay (its own event loop on a thread) that can cut requests on cue and scans responses."""

    def __init__(self, target_port: int, scanner: WireScanner | None = None, *, http: bool = True) -> None:
        self.port = free_port()
        self.target = target_port
        self.http = http
        self.scanner = scanner
        self.stats = RelayStats()
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self._ids = iter(range(1, 1 << 62))
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[_Connection] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name="relay", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def database_url(self, database_url: str) -> str:
        """`database_url` pointed at this relay (a PostgreSQL relay built with `http=False`)."""
        return (
            make_url(database_url).set(host="127.0.0.1", port=self.port).render_as_string(hide_password=False)
        )

    # -- control, from the test's thread --

    def fault(self, match: str, action: FaultAction, times: int = 1) -> Fault:
        """Cut the next `times` requests whose head (request line and headers) contains `match`."""
        armed = Fault(match.lower().encode(), action, times)
        with self._lock:
            self._faults.append(armed)
        return armed

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def count(self, match: str) -> int:
        """How many requests whose head contains `match` reached the relay."""
        needle = match.lower().encode()
        with self._lock:
            return sum(needle in head for head in self.stats.requests)

    def up(self) -> Relay:
        async def start() -> None:
            self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

        self._call(start())
        return self

    def down(self) -> None:
        """Stop accepting and abort every open connection (an outage)."""

        async def stop() -> None:
            if self._server is not None:
                self._server.close()
                await self._server.wait_closed()
                self._server = None
            for connection in list(self._connections):
                self._abort(connection)

        self._call(stop())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.down()
            self._call(self._end_pending())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    async def _end_pending(self) -> None:
        """Cancel what still runs on the relay's loop (a connection accepted as it went down, still reaching
        its target) and let it end, so nothing is left pending when the loop stops."""
        pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=10)

    # -- relaying, on the relay's loop --

    def _take_fault(self, head: bytes) -> FaultAction | None:
        with self._lock:
            self.stats.requests.append(head)
            for armed in self._faults:
                if armed.fired < armed.times and armed.match in head:
                    armed.fired += 1
                    self.stats.cuts.append((armed.match.decode(), armed.action))
                    return armed.action
        return None

    def _abort(self, connection: _Connection) -> None:
        for writer in (connection.client, connection.upstream):
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._connections.discard(connection)
        if self.scanner is not None:
            self.scanner.close(connection.ident)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.transport.abort()
            return
        connection = _Connection(next(self._ids), writer, up_writer)
        self._connections.add(connection)
        with self._lock:
            self.stats.connections += 1
        await asyncio.gather(
            self._requests(reader, connection), self._responses(up_reader, connection), return_exceptions=True
        )
        self._abort(connection)

    async def _requests(self, reader: asyncio.StreamReader, connection: _Connection) -> None:
        try:
            while data := await reader.read(65536):
                if not connection.awaiting_head or not self.http:
                    connection.upstream.write(data)
                    await connection.upstream.drain()
                    continue
                connection.head += data
                end = connection.head.find(b"\r\n\r\n")
                if end < 0:
                    continue  # hold the request until its head is complete
                buffered, connection.head = connection.head, b""
                connection.awaiting_head = False
                action = self._take_fault(buffered[:end].lower())
                if action == "refuse":
                    self._abort(connection)  # the server never sees this request
                    return
                connection.armed = action
                connection.upstream.write(buffered)
                await connection.upstream.drain()
        finally:
            with contextlib.suppress(Exception):
                connection.upstream.write_eof()

    async def _responses(self, reader: asyncio.StreamReader, connection: _Connection) -> None:
        try:
            while data := await reader.read(65536):
                if self.scanner is not None:
                    self.scanner.feed(connection.ident, data)
                connection.awaiting_head = self.http
                if connection.armed == "cut_at_first_byte":
                    self._abort(connection)
                    return
                if connection.armed == "cut_after_reply":
                    # Let the server finish: once its JSON-RPC answer is written, the call has fully
                    # happened on the server; the client never gets it.
                    connection.swallowed += data
                    if b'"result"' in connection.swallowed or b'"error"' in connection.swallowed:
                        await asyncio.sleep(0.05)
                        self._abort(connection)
                        return
                    continue
                connection.client.write(data)
                await connection.client.drain()
        finally:
            with contextlib.suppress(Exception):
                connection.client.close()
