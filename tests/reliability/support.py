"""Tools of the reliability suite: a TCP relay that cuts connections on cue and scans every byte the
server sends, the reliability server as a subprocess, and database triggers that record every status
change and every write.

- `Relay`: sits between the clients and a server (or between a server and PostgreSQL). `fault()` arms
  a one-shot cut for the next request whose head matches: refuse it before the server sees it, cut it
  as soon as the server starts answering, or let the server finish and swallow its answer. Every
  byte the server sends goes through a `WireScanner`.
- `WireScanner`: looks for configured secrets (signing keys, bearer tokens, a database password),
  `Traceback` and server source paths in every response, across chunk boundaries.
- `ReliabilityServer`: `python -m tests.reliability.app` on a free port, restartable, killable with
  SIGKILL, with its memory and open file descriptors readable from /proc.
- `install_audit` / `audit_edges` / `write_count`: SQL triggers, installed beside the handles tables,
  that log each `status` change (old, new) and count each row written, whoever writes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx2
from mcp.shared.inbound import encode_header_value
from sqlalchemy import create_engine, make_url, text

from handles.states import Status, can_transition
from tests.support import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTOCOL = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"

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
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

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


# -- the server process --------------------------------------------------------------------------


@dataclass
class ReliabilityServer:
    """`python -m tests.reliability.app` as a subprocess on a fixed data directory and port."""

    data_dir: Path
    env: dict[str, str] = field(repr=False)
    tokens: dict[str, str] | None = field(default=None, repr=False)
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "server.log"

    @property
    def tokens_path(self) -> Path:
        return self.data_dir / "tokens.json"

    def write_tokens(self, tokens: dict[str, str]) -> None:
        """Replace the accepted tokens (the server re-reads the file on its next request)."""
        self.tokens = dict(tokens)
        staged = self.tokens_path.with_suffix(".tmp")
        staged.write_text(json.dumps(self.tokens))
        os.replace(staged, self.tokens_path)
        # mtime granularity: make sure the change is visible even within the same tick.
        stamp = time.time_ns()
        os.utime(self.tokens_path, ns=(stamp, stamp))

    def start(self, timeout: float = 30.0) -> ReliabilityServer:
        assert self.process is None or self.process.poll() is not None, "already running"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-m", "tests.reliability.app", "--port", str(self.port)]
        if self.tokens is not None:
            if not self.tokens_path.exists():
                self.write_tokens(self.tokens)
            args += ["--tokens", str(self.tokens_path)]
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": os.environ.get("HOME", str(self.data_dir)),
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(REPO_ROOT),
            "HANDLES_DATA_DIR": str(self.data_dir),
            **self.env,
        }
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                args, env=env, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the reliability server exited:\n{self.log()[-4000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"the reliability server did not listen within {timeout} s:\n{self.log()[-4000:]}")

    def kill(self) -> None:
        """SIGKILL: no clean-up, no settling of running jobs."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))


# -- database triggers: every status change and every write, whoever makes it ----------------------

_SQLITE_AUDIT = [
    "CREATE TABLE IF NOT EXISTS reliability_audit (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
    "job_id TEXT NOT NULL, old TEXT, new TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS reliability_writes (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
    "tbl TEXT NOT NULL, op TEXT NOT NULL, job_id TEXT, abandon_changed INTEGER NOT NULL DEFAULT 0)",
    "CREATE TRIGGER IF NOT EXISTS reliability_job_inserted AFTER INSERT ON handles_jobs BEGIN "
    "INSERT INTO reliability_audit(job_id, old, new) VALUES (NEW.id, NULL, NEW.status); "
    "INSERT INTO reliability_writes(tbl, op, job_id) VALUES ('jobs', 'insert', NEW.id); END",
    "CREATE TRIGGER IF NOT EXISTS reliability_job_status AFTER UPDATE ON handles_jobs "
    "WHEN OLD.status <> NEW.status BEGIN "
    "INSERT INTO reliability_audit(job_id, old, new) VALUES (NEW.id, OLD.status, NEW.status); END",
    "CREATE TRIGGER IF NOT EXISTS reliability_job_updated AFTER UPDATE ON handles_jobs BEGIN "
    "INSERT INTO reliability_writes(tbl, op, job_id, abandon_changed) VALUES ('jobs', 'update', NEW.id, "
    "OLD.abandon_at IS NOT NEW.abandon_at); END",
    "CREATE TRIGGER IF NOT EXISTS reliability_job_deleted AFTER DELETE ON handles_jobs BEGIN "
    "INSERT INTO reliability_writes(tbl, op, job_id) VALUES ('jobs', 'delete', OLD.id); END",
    *(
        f"CREATE TRIGGER IF NOT EXISTS reliability_{table}_{op} AFTER {op.upper()} ON handles_{table} BEGIN "
        f"INSERT INTO reliability_writes(tbl, op, job_id) VALUES ('{table}', '{op}', "
        f"{'OLD' if op == 'delete' else 'NEW'}.job_id); END"
        for table in ("input_requests", "steps")
        for op in ("insert", "update", "delete")
    ),
]

_POSTGRES_AUDIT = [
    "CREATE TABLE IF NOT EXISTS reliability_audit (seq BIGSERIAL PRIMARY KEY, job_id TEXT NOT NULL, "
    "old TEXT, new TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS reliability_writes (seq BIGSERIAL PRIMARY KEY, tbl TEXT NOT NULL, "
    "op TEXT NOT NULL, job_id TEXT, abandon_changed INTEGER NOT NULL DEFAULT 0)",
    """CREATE OR REPLACE FUNCTION reliability_job_audit() RETURNS trigger AS $$
    BEGIN
      IF TG_OP = 'INSERT' THEN
        INSERT INTO reliability_audit(job_id, old, new) VALUES (NEW.id, NULL, NEW.status);
        INSERT INTO reliability_writes(tbl, op, job_id) VALUES ('jobs', 'insert', NEW.id);
      ELSIF TG_OP = 'UPDATE' THEN
        IF OLD.status <> NEW.status THEN
          INSERT INTO reliability_audit(job_id, old, new) VALUES (NEW.id, OLD.status, NEW.status);
        END IF;
        INSERT INTO reliability_writes(tbl, op, job_id, abandon_changed)
          VALUES ('jobs', 'update', NEW.id, (OLD.abandon_at IS DISTINCT FROM NEW.abandon_at)::int);
      ELSE
        INSERT INTO reliability_writes(tbl, op, job_id) VALUES ('jobs', 'delete', OLD.id);
      END IF;
      RETURN NULL;
    END $$ LANGUAGE plpgsql""",
    "DROP TRIGGER IF EXISTS reliability_job_audit ON handles_jobs",
    "CREATE TRIGGER reliability_job_audit AFTER INSERT OR UPDATE OR DELETE ON handles_jobs "
    "FOR EACH ROW EXECUTE FUNCTION reliability_job_audit()",
]


def install_audit(database_url: str) -> None:
    """Create the handles schema (if needed) and the audit triggers beside it."""
    from handles.store import JobRepository

    repository = JobRepository(database_url)
    try:
        repository.create_schema()
        statements = _POSTGRES_AUDIT if repository.dialect == "postgresql" else _SQLITE_AUDIT
        with repository.engine.begin() as connection:
            for statement in statements:
                connection.exec_driver_sql(statement)
    finally:
        repository.dispose()


def _rows(database_url: str, query: str, **params: Any) -> list[Any]:
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            return list(connection.execute(text(query), params))
    finally:
        engine.dispose()


def audit_edges(database_url: str) -> list[tuple[str, str | None, str]]:
    """Every (job id, old status, new status) the triggers saw, in order."""
    return [
        tuple(row)
        for row in _rows(database_url, "SELECT job_id, old, new FROM reliability_audit ORDER BY seq")
    ]  # type: ignore[misc]


def invalid_edges(database_url: str) -> list[tuple[str, str | None, str]]:
    """Status changes the transition table does not allow (a job must also be born `working`)."""
    bad = []
    for job_id, old, new in audit_edges(database_url):
        if old is None:
            if new != Status.WORKING.value:
                bad.append((job_id, old, new))
        elif not can_transition(Status(old), Status(new)):
            bad.append((job_id, old, new))
    return bad


def write_count(database_url: str, job_id: str | None = None, *, abandon_only: bool = False) -> int:
    """Rows written to the handles tables (for one job, or in all), as the triggers counted them."""
    query = "SELECT count(*) FROM reliability_writes WHERE 1=1"
    if job_id is not None:
        query += " AND job_id = :job_id"
    if abandon_only:
        query += " AND abandon_changed = 1"
    return int(_rows(database_url, query, job_id=job_id)[0][0])


def jobs_in_store(database_url: str, kind: str | None = None) -> list[dict[str, Any]]:
    """Every stored job (of `kind`): id, kind, principal, status, attempts, idempotency key, arguments."""
    query = "SELECT id, kind, principal, status, attempts, idempotency_key, arguments FROM handles_jobs"
    if kind is not None:
        query += " WHERE kind = :kind"
    jobs = []
    for row in _rows(database_url, query + " ORDER BY created_at", kind=kind):
        job = dict(row._mapping)
        if isinstance(job["arguments"], str):
            job["arguments"] = json.loads(job["arguments"])
        jobs.append(job)
    return jobs


# -- a raw 2026-07-28 JSON-RPC client (for fuzzing and byte-exact checks) --------------------------


def envelope(*, declare: bool) -> dict[str, Any]:
    capabilities: dict[str, Any] = {"extensions": {TASKS: {}}} if declare else {}
    return {
        "io.modelcontextprotocol/protocolVersion": PROTOCOL,
        "io.modelcontextprotocol/clientCapabilities": capabilities,
        "io.modelcontextprotocol/clientInfo": {"name": "reliability", "version": "0"},
    }


@dataclass
class RawReply:
    status: int
    body: dict[str, Any] | None
    raw: str
    seconds: float

    @property
    def result(self) -> dict[str, Any]:
        assert self.body is not None and "result" in self.body, self.raw[:2000]
        result: dict[str, Any] = self.body["result"]
        return result

    @property
    def error(self) -> dict[str, Any]:
        assert self.body is not None and "error" in self.body, self.raw[:2000]
        error: dict[str, Any] = self.body["error"]
        return error

    def tool_body(self) -> dict[str, Any]:
        """A tools/call result's structured content, or the JSON of its text (caller errors)."""
        result = self.result
        if result.get("structuredContent") is not None:
            return dict(result["structuredContent"])
        text_block = result["content"][0]["text"]
        try:
            parsed = json.loads(text_block)
        except json.JSONDecodeError:
            return {"error": "sdk", "message": text_block}
        return parsed if isinstance(parsed, dict) else {"error": "sdk", "message": text_block}


def _final_message(raw: str, content_type: str) -> dict[str, Any] | None:
    if content_type.startswith("text/event-stream"):
        final = None
        for event in raw.replace("\r\n", "\n").split("\n\n"):
            data = "\n".join(line[5:].lstrip() for line in event.split("\n") if line.startswith("data:"))
            if data:
                message = json.loads(data)
                if "id" in message and ("result" in message or "error" in message):
                    final = message
        return final
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


_request_ids = iter(range(1, 1 << 62))


async def raw_call(
    http: httpx2.AsyncClient,
    url: str,
    method: str,
    params: Any,
    *,
    token: str | None,
    declare: bool = True,
    name: str | None = None,
    add_meta: bool = True,
) -> RawReply:
    """One JSON-RPC POST as a 2026-07-28 client sends it (headers mirror the body unless `name` says otherwise)."""
    if add_meta and isinstance(params, dict):
        params = {**params, "_meta": {**envelope(declare=declare), **(params.get("_meta") or {})}}
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": PROTOCOL,
        "Mcp-Method": method,
    }
    if name is None and isinstance(params, dict):
        value = params.get(
            "taskId" if method.startswith("tasks/") else "uri" if method == "resources/read" else "name"
        )
        name = value if isinstance(value, str) else None
    if name is not None:
        with contextlib.suppress(UnicodeEncodeError):  # a lone surrogate cannot travel in a header
            headers["Mcp-Name"] = encode_header_value(name)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = {"jsonrpc": "2.0", "id": next(_request_ids), "method": method, "params": params}
    began = time.perf_counter()
    response = await http.post(url, content=json.dumps(request), headers=headers)
    seconds = time.perf_counter() - began
    raw = response.text
    return RawReply(
        response.status_code, _final_message(raw, response.headers.get("content-type", "")), raw, seconds
    )


def report(name: str, figures: dict[str, Any]) -> None:
    """Print a test's figures as one JSON line (`pytest -s` shows it); `RELIABILITY_REPORT=path` appends it."""
    line = json.dumps({"test": name, **figures})
    print(line)
    path = os.environ.get("RELIABILITY_REPORT")
    if path:
        with Path(path).open("a") as out:
            out.write(line + "\n")
