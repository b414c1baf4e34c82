"""The requests `handles check` sends as one principal, each kept with its answer as evidence."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_NAME_HEADER, encode_header_value
from mcp_types import CallToolResult, ElicitResult

from handles.check.plan import JobPlan
from handles.client.faces import caller_error
from handles.client.follow import connect
from handles.client.http import http_client
from handles.client.manifest import JobManifest
from handles.client.task_messages import TERMINAL_STATUSES, CreateTaskResult
from handles.results import text_of

REQUEST_SECONDS = 30.0


@dataclass(frozen=True)
class Reply:
    """One request and its answer: `request` names it for the evidence (values shown by their labels)."""

    request: str
    error: bool
    body: dict[str, Any]
    text: str

    @property
    def status(self) -> str | None:
        value = self.body.get("status")
        return str(value) if value is not None else None

    def shown(self, limit: int = 300) -> str:
        """The request and a short form of its answer."""
        text = " ".join(self.text.split())
        answer = text if len(text) <= limit else text[:limit] + "..."
        return f"{self.request} -> {'error ' if self.error else ''}{answer}"


@dataclass
class Transcript:
    """Every reply of a run (what the hygiene gate reads), and the labels long values are shown by."""

    replies: list[Reply] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)

    def label(self, value: str, name: str) -> str:
        self.labels[value] = name
        return value

    def describe(self, text: str) -> str:
        for value, name in self.labels.items():
            text = text.replace(value, f"<{name}>")
        return text


def made_up_id() -> str:
    """An id no server ever issued, shaped like a long random token."""
    return "made-up-" + secrets.token_urlsafe(24)


def altered(identifier: str) -> str:
    """`identifier` with one character in its middle changed."""
    middle = len(identifier) // 2
    return identifier[:middle] + ("B" if identifier[middle] == "A" else "A") + identifier[middle + 1 :]


class Caller:
    """One principal's connection; every request it sends lands in the shared transcript."""

    def __init__(self, name: str, client: Client, transcript: Transcript) -> None:
        self.name, self.client, self.transcript = name, client, transcript
        self.answer: dict[str, Any] | None = None
        """What this caller accepts a question asked on its stream with (None: it declines)."""

    def _keep(self, request: str, error: bool, body: dict[str, Any], text: str) -> Reply:
        reply = Reply(self.transcript.describe(f"{self.name}: {request}"), error, body, text)
        self.transcript.replies.append(reply)
        return reply

    async def call(self, tool: str, arguments: dict[str, Any]) -> Reply:
        """`tools/call`; a task answer (declared extension) is kept unresolved, with `resultType: task`."""
        request = f"tools/call {tool} {json.dumps(arguments, default=str)}"
        try:
            result = await self.client.session.call_tool(
                tool, arguments, read_timeout_seconds=REQUEST_SECONDS, allow_claimed=True
            )
        except MCPError as exc:
            return self._rpc_error(request, exc)
        if isinstance(result, CreateTaskResult):
            body = result.model_dump(mode="json", by_alias=True, exclude_none=True)
            return self._keep(request, False, body, json.dumps(body))
        assert isinstance(result, CallToolResult)
        body = dict(result.structured_content or caller_error(result))
        return self._keep(request, result.is_error, body, text_of(result) or json.dumps(body, default=str))

    async def task(self, method: str, task_id: str, **params: Any) -> Reply:
        """A `tasks/*` request on `task_id` (`tasks/update` takes `inputResponses`)."""
        return await self.send(f"{method} {task_id}", method, {"taskId": task_id, **params})

    async def send(self, request: str, method: str, params: dict[str, Any]) -> Reply:
        """Any request as this connection stamps it (`Mcp-Name` naming its `taskId`); the answer kept raw."""
        data: dict[str, Any] = {"method": method, "params": params}
        options: Any = {"timeout": REQUEST_SECONDS}
        session: Any = self.client.session
        session._stamp(data, options)
        if "taskId" in params:
            options.setdefault("headers", {})[MCP_NAME_HEADER] = encode_header_value(params["taskId"])
        try:
            body = await session._dispatcher.send_raw_request(method, data["params"], options)
        except MCPError as exc:
            return self._rpc_error(request, exc)
        return self._keep(request, False, body, json.dumps(body))

    def _rpc_error(self, request: str, exc: MCPError) -> Reply:
        body = exc.error.model_dump(mode="json", exclude_none=True)
        return self._keep(request, True, body, json.dumps(body))


Server = str | StdioServerParameters
"""A server's Streamable HTTP endpoint, or the command that serves it over stdio."""


@asynccontextmanager
async def open_caller(
    name: str, server: Server, token: str | None, transcript: Transcript, mode: str = "tasks"
) -> AsyncIterator[Caller]:
    """A `Caller` on `server` with `token` (a URL's) that declares the Tasks extension; with `mode`
    `"auto"` one that does not, `"legacy"` one connected by an initialize handshake (2025-11-25)."""
    if mode == "tasks":
        async with connect(server, token=token)() as client:
            yield Caller(name, client, transcript)
        return

    async def answer(context: Any, params: Any) -> ElicitResult:
        if caller.answer is None:
            return ElicitResult(action="decline")
        return ElicitResult(action="accept", content=caller.answer)

    async with AsyncExitStack() as stack:
        target: Any = server
        if not isinstance(server, StdioServerParameters):
            http = await stack.enter_async_context(http_client(token=token))
            target = streamable_http_client(server, http_client=http)
        client = await stack.enter_async_context(
            Client(target, mode=mode, elicitation_callback=answer if mode == "legacy" else None)
        )
        caller = Caller(name, client, transcript)
        yield caller


async def start(caller: Caller, job: JobManifest, plan: JobPlan, key: str | None = None) -> Reply:
    """`<job>_start` with the plan's arguments (and an idempotency key when given)."""
    arguments = {**plan.arguments, **({"idempotency_key": key} if key is not None else {})}
    return await caller.call(job.tools["start"], arguments)


async def settle(
    caller: Caller, job: JobManifest, plan: JobPlan, handle: str, seen: list[str | None] | None = None
) -> Reply:
    """Poll `progress` until the job ends, answering its questions with the plan's answer (each status read
    appended to `seen`); the last reply."""
    deadline = anyio.current_time() + plan.timeout
    while True:
        reply = await caller.call(job.tools["progress"], {"handle": handle})
        if seen is not None:
            seen.append(reply.status)
        if reply.error or reply.status in TERMINAL_STATUSES or anyio.current_time() > deadline:
            return reply
        questions = reply.body.get("input_requests") or {}
        if reply.status == "input_required" and questions and "respond" in job.tools:
            answers = {key: plan.answer or {} for key in questions}
            await caller.call(job.tools["respond"], {"handle": handle, "responses": answers})
            continue
        await anyio.sleep(min(max((reply.body.get("poll_after_ms") or 500) / 1000, 0.2), 1.0))


async def settle_task(
    caller: Caller, plan: JobPlan, task_id: str, seen: list[str | None] | None = None
) -> Reply:
    """`settle` for a task, through `tasks/get`, answering with `tasks/update` (the extension) or on the
    stream of `tasks/result` (2025-11-25, whose `tasks/get` shows no questions)."""
    deadline, caller.answer = anyio.current_time() + plan.timeout, plan.answer
    while True:
        reply = await caller.task("tasks/get", task_id)
        if seen is not None:
            seen.append(reply.status)
        if reply.error or reply.status in TERMINAL_STATUSES or anyio.current_time() > deadline:
            return reply
        if reply.status == "input_required" and (questions := reply.body.get("inputRequests")):
            accept = {"action": "accept", "content": plan.answer or {}}
            await caller.task("tasks/update", task_id, inputResponses={key: accept for key in questions})
            continue
        if reply.status == "input_required":
            await caller.task("tasks/result", task_id)
            continue
        poll = reply.body.get("pollIntervalMs") or reply.body.get("pollInterval") or 500
        await anyio.sleep(min(max(poll / 1000, 0.2), 1.0))
