"""Tools of the reliability suite: the reliability server as a subprocess, database triggers that
record every status change and every write, and a raw JSON-RPC client. (The TCP relay that cuts
connections and scans every byte the server sends is `tests.harness.relay`.)

- `ReliabilityServer`: `python -m tests.reliability.app` on a free port, restartable, killable with
  SIGKILL, with its memory and open file descriptors readable from /proc.
- `install_audit` / `audit_edges` / `write_count`: SQL triggers, installed beside the handles tables,
  that log each `status` change (old, new) and count each row written, whoever writes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import httpx2
from mcp.shared.inbound import encode_header_value
from sqlalchemy import text

from handles.states import Status, can_transition
from tests.harness.database import own_connection
from tests.harness.process import ServerProcess, free_port, python_module, server_env
from tests.tasks.wire import PROTOCOL, meta, parse_sse

# -- the server process --------------------------------------------------------------------------


class ReliabilityServer(ServerProcess):
    """`python -m tests.reliability.app` as a subprocess on a fixed data directory and port."""

    def __init__(self, data_dir: Path, env: dict[str, str], tokens: dict[str, str] | None = None) -> None:
        self.data_dir, self.tokens = data_dir, tokens
        port = free_port()
        args = python_module("tests.reliability.app", "--port", str(port))
        if tokens is not None:
            args += ["--tokens", str(self.tokens_path)]
        super().__init__(
            args,
            server_env(data_dir, **env),
            data_dir / "server.log",
            port,
            name="the reliability server",
            append_log=True,
        )

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

    def start(self, timeout: float | None = None) -> Self:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.tokens is not None and not self.tokens_path.exists():
            self.write_tokens(self.tokens)
        return super().start(timeout)


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
        repository.prepare(auto_migrate=True)
        statements = _SQLITE_AUDIT if repository.sqlite else _POSTGRES_AUDIT
        with repository.engine.begin() as connection:
            for statement in statements:
                connection.exec_driver_sql(statement)
    finally:
        repository.dispose()


def _rows(database_url: str, query: str, **params: Any) -> list[Any]:
    with own_connection(database_url) as connection:
        return list(connection.execute(text(query), params))


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


def final_message(raw: str, content_type: str) -> dict[str, Any] | None:
    if content_type.startswith("text/event-stream"):
        final = None
        for message in parse_sse(raw):
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
        params = {**params, "_meta": {**meta(declare=declare), **(params.get("_meta") or {})}}
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
        response.status_code, final_message(raw, response.headers.get("content-type", "")), raw, seconds
    )


def report(name: str, figures: dict[str, Any]) -> None:
    """Print a test's figures as one JSON line (`pytest -s` shows it); `RELIABILITY_REPORT=path` appends it."""
    line = json.dumps({"test": name, **figures})
    print(line)
    path = os.environ.get("RELIABILITY_REPORT")
    if path:
        with Path(path).open("a") as out:
            out.write(line + "\n")
