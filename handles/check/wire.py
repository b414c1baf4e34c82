"""The requests `handles check` sends as one principal, each kept with its answer as evidence."""

from __future__ import annotations

import json
import secrets
import textwrap
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack, ExitStack, asynccontextmanager
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
from handles.client.http import http_client
from handles.client.manifest import JobManifest
from handles.client.tasks import (
    TERMINAL_STATUSES,
    CreateTaskResult,
    TaskPushes,
    TasksClientExtension,
    listen_tasks,
    send_unchecked,
)
from handles.results import text_of

REQUEST_SECONDS = 30.0
PUSH_SECONDS = 0.5
"""How long a `subscriptions/listen` stream is watched for pushed status after its acknowledgement."""


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

    @property
    def poll_ms(self) -> float | None:
        """When the reply says to poll again (`poll_after_ms`, or a task's `pollInterval`)."""
        body = self.body
        hint = body.get("poll_after_ms") or body.get("pollIntervalMs") or body.get("pollInterval")
        return hint if isinstance(hint, int | float) and hint > 0 else None

    def shown(self, limit: int = 300) -> str:
        """The request and a short form of its answer."""
        answer = textwrap.shorten(self.text, limit, placeholder="...")
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
        longest_first = sorted(self.labels.items(), key=lambda label: -len(label[0]))  # a link holds its id
        for value, name in longest_first:
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

    def __init__(self, name: str, client: Client, transcript: Transcript, pushes: TaskPushes | None) -> None:
        self.name, self.client, self.transcript = name, client, transcript
        self.pushes = pushes or TaskPushes()
        """Where its `TasksClientExtension` keeps pushed states (a caller without one is pushed nothing)."""
        self.older = client.session.discover_result is None and client.protocol_version == "2025-11-25"
        """Whether it was connected by an initialize handshake at 2025-11-25 (the older tasks design)."""
        self.answer: dict[str, Any] | None = None
        """What this caller accepts a question asked on its stream with (None: it declines)."""

    def _keep(self, request: str, body: dict[str, Any], error: bool = False, text: str = "") -> Reply:
        text = text or json.dumps(body)
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
            return self._keep(request, exc.error.model_dump(mode="json", exclude_none=True), error=True)
        if isinstance(result, CreateTaskResult):
            return self._keep(request, result.model_dump(mode="json", by_alias=True, exclude_none=True))
        assert isinstance(result, CallToolResult)
        body = dict(result.structured_content or caller_error(result))
        return self._keep(request, body, result.is_error, text_of(result) or json.dumps(body, default=str))

    async def send(self, request: str, method: str, params: dict[str, Any]) -> Reply:
        """Any request as this connection stamps it (`Mcp-Name` naming its `taskId`); the answer kept raw."""
        named = {MCP_NAME_HEADER: encode_header_value(params["taskId"])} if "taskId" in params else None
        try:
            body = await send_unchecked(
                self.client.session, method, params, timeout=REQUEST_SECONDS, headers=named
            )
        except MCPError as exc:
            return self._keep(request, exc.error.model_dump(mode="json", exclude_none=True), error=True)
        return self._keep(request, body)

    async def read(self, uri: str) -> Reply:
        """`resources/read` of `uri` (a result link)."""
        return await self.send(f"resources/read {uri}", "resources/read", {"uri": uri})

    async def listen(self, task_ids: list[str]) -> Reply:
        """`subscriptions/listen` of `task_ids`: the ids acknowledged, and those pushed in `PUSH_SECONDS`."""
        with ExitStack() as watching:
            for task_id in task_ids:
                watching.enter_context(self.pushes.watching(task_id))
            async with listen_tasks(self.client.session, task_ids) as subscription:
                await anyio.sleep(PUSH_SECONDS)
            pushed = [task_id for task_id in task_ids if self.pushes.latest(task_id) is not None]
        body = {"honored": sorted(subscription.honored), "pushed": pushed}
        return self._keep(f"subscriptions/listen {' '.join(task_ids)}", body)


Server = str | StdioServerParameters
"""A server's Streamable HTTP endpoint, or the command that serves it over stdio."""


@asynccontextmanager
async def open_caller(
    name: str, server: Server, token: str | None, transcript: Transcript, mode: str = "tasks"
) -> AsyncIterator[Caller]:
    """A `Caller` on `server` with `token` (a URL's) that declares the Tasks extension; with `mode`
    `"auto"` one that does not, `"legacy"` one connected by an initialize handshake (2025-11-25)."""

    async def answer(context: Any, params: Any) -> ElicitResult:
        if caller.answer is None:
            return ElicitResult(action="decline")
        return ElicitResult(action="accept", content=caller.answer)

    async with AsyncExitStack() as stack:
        target: Any = server
        if not isinstance(server, StdioServerParameters):
            http = await stack.enter_async_context(http_client(token=token))
            target = streamable_http_client(server, http_client=http)
        tasks = TasksClientExtension() if mode == "tasks" else None
        client = Client(
            target,
            mode="auto" if tasks else mode,
            elicitation_callback=answer if mode == "legacy" else None,
            extensions=[tasks] if tasks else None,
        )
        pushes = tasks.pushes if tasks else None
        caller = Caller(name, await stack.enter_async_context(client), transcript, pushes)
        yield caller


async def start(caller: Caller, job: JobManifest, plan: JobPlan, key: str | None = None) -> Reply:
    """`<job>_start` with the plan's arguments (and an idempotency key when given)."""
    arguments = {**plan.arguments, **({"idempotency_key": key} if key is not None else {})}
    return await caller.call(job.tools["start"], arguments)


TASK_METHODS = {"progress": "tasks/get", "cancel": "tasks/cancel"}
"""The `tasks/*` method doing for a task what a handle tool does for a job."""


@dataclass(frozen=True)
class Followed:
    """A job this run started, followed through its handle tools (`job`), or a task (`job` None)."""

    caller: Caller
    plan: JobPlan
    id: str
    job: JobManifest | None = None

    async def ask(
        self, request: str, caller: Caller | None = None, used: str | None = None, **params: Any
    ) -> Reply:
        """`request` (a handle tool's verb, or a task's `tasks/*` method) about this job or about `used`."""
        caller, used = caller or self.caller, used or self.id
        if self.job is None:
            method = TASK_METHODS.get(request, request)
            return await caller.send(f"{method} {used}", method, {"taskId": used, **params})
        return await caller.call(self.job.tools[request], {"handle": used, **params})

    async def read(self) -> Reply:
        return await self.ask("progress")

    async def cancel(self) -> Reply:
        return await self.ask("cancel")

    async def respond(
        self, caller: Caller | None = None, used: str | None = None, keys: Iterable[str] = ("q1",)
    ) -> Reply:
        """Answer the questions `keys` with the plan's answer: through `respond`, a task's `tasks/update`, or
        (2025-11-25) `tasks/result`, whose stream asks them."""
        content = self.plan.answer or {}
        if self.job is not None:
            return await self.ask("respond", caller, used, responses=dict.fromkeys(keys, content))
        if self.caller.older:
            return await self.ask("tasks/result", caller, used)
        accept = {"action": "accept", "content": content}
        return await self.ask("tasks/update", caller, used, inputResponses=dict.fromkeys(keys, accept))

    async def settle(self, seen: list[str | None] | None = None) -> Reply:
        """Read until the job ends or times out (statuses appended to `seen`), answering its questions."""
        caller, plan, job = self.caller, self.plan, self.job
        deadline, caller.answer = anyio.current_time() + plan.timeout, plan.answer
        while True:
            reply = await self.read()
            if seen is not None:
                seen.append(reply.status)
            if reply.error or reply.status in TERMINAL_STATUSES or anyio.current_time() > deadline:
                return reply
            questions = reply.body.get("input_requests") or reply.body.get("inputRequests") or {}
            answerable = questions and "respond" in job.tools if job else questions or caller.older
            if reply.status == "input_required" and answerable:
                await self.respond(keys=questions)
                continue
            await anyio.sleep(min(max((reply.poll_ms or 500) / 1000, 0.2), 1.0))

    async def finish(self) -> Reply:
        """Cancel it when the plan allows, then wait for its end."""
        if self.plan.cancel and (self.job is None or "cancel" in self.job.tools):
            await self.cancel()
        return await self.settle()
