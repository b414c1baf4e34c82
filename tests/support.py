"""Helpers shared by the test suites: a checking tool client, example-server processes, handle forging.

Everything here drives real parts: the official `mcp.Client` (in-process, stdio or
Streamable HTTP), the example server as a subprocess, and real SQL databases.
Importable as `tests.support` by any test package (tests/tasks/ included).
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Self

from jsonschema.validators import validator_for
from mcp import Client, StdioServerParameters
from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult, ElicitResult, ResourceLink, TextContent, Tool
from sqlalchemy import update
from sqlmodel import col

from handles import Handles, HandlesConfig
from handles.handle import HandleCodec
from handles.states import ACTIVE
from handles.store import InputRequestRecord, JobRecord, JobRepository, StepRecord, StepState
from handles.store.claims import _claim_values, _claimable
from handles.store.models import STEP_STATE_COLUMNS
from handles.tool_layout import ToolLayout, ToolNames
from tests.harness.client import mcp_over_http
from tests.harness.process import REPO_ROOT, ServerProcess, free_port, python_module, server_env

TOOL_NAME_IN_TEXT = re.compile(r"\b[a-z][a-z0-9_]*_(?:start|progress|fetch|cancel|respond)\b")
"""A generated tool's name inside a sentence (`generate_report_progress`, `jobs_fetch`)."""

JOB_SECONDS = 1.0
"""`EXAMPLE_JOB_SECONDS` for every example server the tests run: long enough to cancel mid-way, short to wait for."""

STORE_POLL_SECONDS = 5.0
"""`HANDLES_STORE_POLL_SECONDS` of the example servers: long, so only a change notification ends a wait quickly."""

DRAIN_SECONDS = 1.0
"""`HANDLES_DRAIN_SECONDS` of the servers the tests stop: a stop waits at most this long for running jobs
(the tests of the drain itself set their own)."""

LOCAL_PRINCIPAL = "local:local"
"""The principal of every unauthenticated request (stdio, in-process, HTTP without tokens)."""

TOKENS = {"token-alice-7Hq2c9": "alice", "token-bob-3Vn8x1": "bob"}
"""Bearer tokens of the authenticated HTTP example server: token -> principal name."""

TRANSPORTS = ["inprocess", "stdio", "http", "fastmcp-inprocess", "fastmcp-http"]
"""How the shared `example` fixture reaches the example: the last two, the example served by FastMCP 4."""


def sdk_server_of(fastmcp_server: Any) -> Any:
    """What the official client connects to in-process for a FastMCP server: its low-level server, which
    is the SDK's own `Server` (FastMCP's in-process client transport connects to the same object)."""
    return fastmcp_server._mcp_server


class MovableClock:
    """A clock a test moves forward (`offset`), for `Handles(config, clock=...)`."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset


def new_key() -> str:
    """A fresh handle signing key (at least 32 characters)."""
    return secrets.token_urlsafe(48)


def token_of(name: str) -> str:
    """The bearer token of principal `name` in `TOKENS`."""
    return next(token for token, principal in TOKENS.items() if principal == name)


def token_principal(name: str) -> str:
    """The principal `handles` derives from a token of the example server's `FileTokenVerifier` for `name`."""
    return "token:" + json.dumps([None, name, name], separators=(",", ":"))


def handles_config(data_dir: Path, keys: Sequence[str], **overrides: Any) -> HandlesConfig:
    """A config on an SQLite file in `data_dir` (or `database_url=`), signing with `keys` (newest first)."""
    overrides.setdefault("store_poll_seconds", STORE_POLL_SECONDS)
    overrides.setdefault("drain_seconds", DRAIN_SECONDS)
    return HandlesConfig(data_dir=data_dir, secret_keys=tuple(keys), **overrides)


def example_env(data_dir: Path, keys: Sequence[str], **extra: str) -> dict[str, str]:
    """Environment for an example-server subprocess on `data_dir`, signing with `keys` (newest first)."""
    settings = {
        "HANDLES_SECRET_KEYS": ",".join(keys),
        "EXAMPLE_JOB_SECONDS": str(JOB_SECONDS),
        "HANDLES_STORE_POLL_SECONDS": str(STORE_POLL_SECONDS),
        "HANDLES_DRAIN_SECONDS": str(DRAIN_SECONDS),
    }
    return server_env(data_dir, **(settings | extra))


FRAMEWORKS = ("mcpserver", "fastmcp")
"""The frameworks the example server runs on: the SDK's `MCPServer`, and FastMCP 4 (`--fastmcp`)."""


def framework_args(framework: str) -> list[str]:
    """The example server's command-line switch for `framework`."""
    assert framework in FRAMEWORKS, framework
    return ["--fastmcp"] if framework == "fastmcp" else []


def stdio_params(
    env: dict[str, str], layout: ToolLayout = "per_job", framework: str = "mcpserver"
) -> StdioServerParameters:
    """Launch `python -m example_server --layout <layout>` over stdio with `env`."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "example_server", "--layout", layout, *framework_args(framework)],
        env=env,
        cwd=REPO_ROOT,
    )


# -- forging and reading handles ---------------------------------------------------


def job_id_of(handle: str, key: str, principal: str = LOCAL_PRINCIPAL) -> str:
    """The job id inside a genuine handle (needs the signing key and the handle's principal)."""
    claims = HandleCodec([key]).verify(handle, principal=principal)
    assert claims is not None, "not a genuine handle for this key and principal"
    return claims.job_id


def expired_twin(handle: str, key: str, principal: str = LOCAL_PRINCIPAL) -> str:
    """A correctly signed handle for the same job and principal whose retention ended an hour ago."""
    claims = HandleCodec([key]).verify(handle, principal=principal)
    assert claims is not None
    return HandleCodec([key]).mint(
        job_id=claims.job_id,
        kind=claims.kind,
        principal=principal,
        expires_at=datetime.now(UTC) - timedelta(hours=1),
    )


def tampered_handles(handle: str) -> dict[str, object]:
    """Variants of a genuine handle that must all be refused exactly like a made-up one."""
    payload, _, signature = handle.rpartition(".")
    flip = {"A": "B", "B": "A"}

    def flipped(text: str, index: int) -> str:
        char = text[index]
        return text[:index] + flip.get(char, "A") + text[index + 1 :]

    return {
        "made_up": "not-a-real-handle",
        "empty": "",
        "truncated": handle[:-6],
        "signature_only": signature,
        "payload_only": payload,
        "signature_flipped": payload + "." + flipped(signature, len(signature) // 2),
        "payload_flipped": flipped(payload, len(payload) // 2) + "." + signature,
        "extra_segment": handle + ".AAAA",
        "oversized": handle + "A" * 5000,
        "non_ascii": handle[:-1] + "\u00e9",
        "upper_cased": handle.upper(),
        **{f"respelled_{i}": respelled for i, respelled in enumerate(same_bytes_spellings(handle))},
        "junk_in_signature": payload + "." + signature[:10] + "!" + signature[10:],
    }


BASE64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def last_char_spellings(handle: str) -> list[str]:
    """The handle with every other base64url character in the last position of its signature."""
    return [handle[:-1] + char for char in BASE64URL if char != handle[-1]]


def same_bytes_spellings(handle: str) -> list[str]:
    """Other spellings of the signature's last character that a lenient base64 decoder reads as the same bytes.

    A 32-byte signature is 43 characters: the last one carries 4 bits and 2 slack bits.
    """
    index = BASE64URL.index(handle[-1])
    return [handle[:-1] + BASE64URL[i] for i in range(index & ~3, (index & ~3) + 4) if i != index]


# -- a client that checks every reply -------------------------------------------------


@dataclass
class Reply:
    """One tool result, already checked: `data` is the structured content, or the error JSON from the text."""

    name: str
    result: CallToolResult
    data: dict[str, Any]

    @property
    def is_error(self) -> bool:
        return bool(self.result.is_error)

    @property
    def structured(self) -> dict[str, Any] | None:
        return self.result.structured_content

    @property
    def text(self) -> str:
        block = self.result.content[0]
        assert isinstance(block, TextContent)
        return block.text

    def __getitem__(self, key: str) -> Any:
        return self.data[key]


@dataclass
class ToolClient:
    """`mcp.Client` plus the checks every reply of a handle tool must pass.

    - one text block whose JSON equals `structuredContent` when there is one;
    - `structuredContent` valid against the tool's listed `outputSchema` (error results too);
    - caller errors (no structured content) are `isError` with `error`, `message` and `next`;
    - no `forbidden` string (signing keys, secrets) anywhere in the text;
    - every tool that `next` names is listed (a model is never sent to a tool that does not exist).
    """

    client: Client
    forbidden: Sequence[str] = ()
    _tools: dict[str, Tool] = field(default_factory=dict)

    async def tools(self) -> dict[str, Tool]:
        if not self._tools:
            listing = await self.client.list_tools()
            self._tools = {tool.name: tool for tool in listing.tools}
        return self._tools

    async def call(self, name: str, arguments: dict[str, Any] | None = None) -> Reply:
        """Call `name` and check the result (the SDK client has already checked non-error results)."""
        tools = await self.tools()
        assert name in tools, f"{name} is not listed"
        result = await self.client.call_tool(name, arguments or {})
        return self.check(tools[name], result)

    def check(self, tool: Tool, result: CallToolResult) -> Reply:
        block, *links = result.content
        if links:  # a large result's link: one resource_link, the very link the structured reply names
            assert len(links) == 1 and isinstance(links[0], ResourceLink), result
            assert result.structured_content is not None, result
            assert links[0].uri == result.structured_content["result_link"]["uri"], result
        assert isinstance(block, TextContent), result
        for secret in self.forbidden:
            assert secret not in block.text, f"{tool.name} leaked a secret"
        self.check_next(tool, result)
        if result.structured_content is not None:
            assert json.loads(block.text) == result.structured_content, "text and structuredContent differ"
            assert tool.output_schema is not None
            schema = tool.output_schema
            validator_for(schema)(schema).validate(result.structured_content)
            return Reply(tool.name, result, result.structured_content)
        assert result.is_error, f"{tool.name} returned no structured content: {block.text}"
        try:
            body = json.loads(block.text)
        except json.JSONDecodeError:
            # An error produced by the SDK itself (for example argument validation): plain text.
            return Reply(tool.name, result, {"error": "sdk", "message": block.text})
        assert isinstance(body, dict) and {"error", "message", "next"} <= body.keys(), body
        return Reply(tool.name, result, body)

    def tool_for(self, job: str, verb: str) -> str:
        """`<job>_<verb>`, or the shared `jobs_<verb>` when the server lists that instead (compact layout)."""
        name = f"{job}_{verb}"
        return name if name in self._tools or f"jobs_{verb}" not in self._tools else f"jobs_{verb}"

    def check_next(self, tool: Tool, result: CallToolResult) -> None:
        """Every tool name in the reply's `next` is one `tools/list` lists."""
        block = result.content[0]
        try:
            body = json.loads(block.text) if isinstance(block, TextContent) else None
        except json.JSONDecodeError:
            return
        if isinstance(body, dict) and isinstance(body.get("next"), str):
            named = set(TOOL_NAME_IN_TEXT.findall(body["next"]))
            missing = named - set(self._tools)
            assert not missing, f"{tool.name}'s next names unlisted tools {missing}: {body['next']}"

    async def assert_expired(self, job: str, handle: str, kept: str) -> None:
        """`job`'s progress, fetch and cancel each refuse `handle` as expired: when, after how long a stay
        (`kept`, as the message words it: "1 hour"), and that a new `<job>_start` is the way on."""
        await self.tools()
        for verb in ("progress", "fetch", "cancel"):
            tool = self.tool_for(job, verb)
            reply = await self.call(tool, {"handle": handle})
            assert reply.is_error and reply["error"] == "expired_handle", tool
            assert "expired at" in reply["message"] and kept in reply["message"]
            assert f"{job}_start" in reply["next"]

    async def wait_status(self, job: str, handle: str, *statuses: str, timeout: float = 20.0) -> Reply:
        """Long-poll `<job>_progress` (or `jobs_progress`) until the job's status is one of `statuses`."""
        await self.tools()
        progress = self.tool_for(job, "progress")
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{job} never reached {statuses}"
            reply = await self.call(progress, {"handle": handle, "wait_seconds": min(remaining, 5)})
            assert not reply.is_error, reply.data
            if reply["status"] in statuses:
                return reply


@dataclass
class Connected:
    """A checked client on the example server, and what a test needs to know about that server."""

    client: ToolClient
    transport: str
    key: str
    principal: str
    layout: ToolLayout = "per_job"

    def tool(self, job: str, verb: str) -> str:
        """The name of `job`'s `verb` tool in this server's layout (`<job>_progress` or `jobs_progress`)."""
        return ToolNames.of(self.layout).name(job, verb)


@dataclass
class InProcessExample:
    """The example server built in this process around a `Handles` instance."""

    jobs: Handles
    server: MCPServer[Any]
    key: str
    data_dir: Path


@asynccontextmanager
async def connect(
    target: MCPServer[Any] | StdioServerParameters | str,
    *,
    token: str | None = None,
    forbidden: Sequence[str] = (),
) -> AsyncIterator[ToolClient]:
    """A connected `ToolClient`: in-process for an `MCPServer`, stdio for parameters, HTTP for a URL."""
    opened = mcp_over_http(target, token) if isinstance(target, str) and token is not None else Client(target)
    async with opened as client:
        yield ToolClient(client, forbidden=forbidden)


# -- example server over HTTP ---------------------------------------------------------------


class HttpExampleServer(ServerProcess):
    """`python -m example_server --http` as a subprocess, restartable on the same data directory
    (each start on a fresh port)."""

    def __init__(
        self,
        data_dir: Path,
        keys: list[str],
        tokens: dict[str, str] | None = None,
        layout: ToolLayout | None = None,
        env: dict[str, str] | None = None,
        framework: str = "mcpserver",
    ) -> None:
        self.data_dir, self.keys, self.tokens, self.layout, self.framework = (
            data_dir,
            keys,
            tokens,
            layout,
            framework,
        )
        self.settings = dict(env or {})
        """Extra environment of the server process (`HANDLES_*` settings), over `example_env`'s."""
        super().__init__([], {}, data_dir / "server.log", 0, name="the example server")

    def start(self, timeout: float | None = None) -> Self:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.args = python_module("example_server", "--http", "--port", str(self.port))
        self.args += framework_args(self.framework)
        if self.tokens is not None:
            tokens_file = self.data_dir / "tokens.json"
            tokens_file.write_text(json.dumps(self.tokens))
            self.args += ["--tokens", str(tokens_file)]
        if self.layout is not None:
            self.args += ["--layout", self.layout]
        self.env = example_env(self.data_dir, self.keys, **self.settings)
        self.log_path = self.data_dir / f"server-{self.port}.log"
        return super().start(timeout)

    def restart(self, keys: list[str] | None = None) -> Self:
        self.stop()
        if keys is not None:
            self.keys = keys
        return self.start()


# -- reading answers --------------------------------------------------------------------------


def result_body(result: CallToolResult) -> dict[str, Any]:
    """A tool result's structured content, or the JSON object its text carries (a caller error)."""
    if result.structured_content is not None:
        return result.structured_content
    block = result.content[0]
    assert isinstance(block, TextContent)
    parsed: dict[str, Any] = json.loads(block.text)
    return parsed


async def wait_task(client: Client, task_id: str, *statuses: str, timeout: float = 30.0) -> Any:
    """Poll `tasks/get` (the official client, declaring the extension) until the task has one of `statuses`."""
    from handles.client.tasks import get_task

    deadline = time.monotonic() + timeout
    while True:
        task = await get_task(client.session, task_id)
        if task.status in statuses:
            return task
        assert time.monotonic() < deadline, f"task never reached {statuses}: {task.status}"
        await asyncio.sleep(0.1)


async def approve_deploy_task(client: Client, task_id: str, environment: str) -> None:
    """Answer the question of the `deploy_release` task `task_id` once it asks it (approved, to
    `environment`), and wait for the task's result to name that environment."""
    from handles.client.tasks import update_task

    waiting = await wait_task(client, task_id, "input_required")
    assert waiting.input_requests is not None and "q1" in waiting.input_requests
    approval = ElicitResult(action="accept", content={"approve": True, "environment": environment})
    await update_task(client.session, task_id, {"q1": approval})
    done = await wait_task(client, task_id, "completed")
    assert done.result is not None and done.result["structuredContent"]["environment"] == environment


def claim(repo: JobRepository, job_id: str, owner: str, lease_seconds: float) -> JobRecord | None:
    """Take the queued job `job_id` for `owner` as `claim_next` takes a job; None when it is not claimable
    (held, ended, being cancelled, not yet due, or gone)."""
    now = repo.clock()
    lease_now = repo._lease_now(now)
    with repo._writing() as session:
        claimed = session.execute(
            update(JobRecord)
            .where(col(JobRecord.id) == job_id, *_claimable(lease_now))
            .values(**_claim_values(owner, now, lease_now, lease_seconds))
        )
        return session.get(JobRecord, job_id) if claimed.rowcount == 1 else None


def count_active(repo: JobRepository, principal: str | None = None) -> int:
    """How many active jobs the store holds (of `principal`, when given), by the operator's listing."""
    statuses = [status.value for status in ACTIVE]
    return len(repo.list_jobs(statuses=statuses, principal=principal, limit=1_000_000))


def get_input(repo: JobRepository, job_id: str, key: str) -> InputRequestRecord | None:
    """The question `key` the job asked, answered or not; None when there is none."""
    return next((question for question in repo.questions(job_id) if question.key == key), None)


def step_state(step: StepRecord) -> StepState:
    """The state a progress poll reads of a step read whole."""
    return StepState(**{name: getattr(step, name) for name in STEP_STATE_COLUMNS})
