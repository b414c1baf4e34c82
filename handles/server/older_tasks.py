"""The experimental Tasks design of MCP 2025-11-25, for clients that connected with `initialize` at that
version: the same jobs and work as `TasksExtension`, in that design's wire shapes, as server middleware.

On stateless HTTP a client's answer to a question, a POSTed JSON-RPC response, has no request waiting for
it: `OlderAnswers` serves it as an `ANSWER_METHOD` request, authenticated and stored like every call."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from mcp.server.context import CallNext, HandlerResult
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types import (
    INVALID_PARAMS,
    ElicitRequest,
    ElicitResult,
    JSONRPCRequest,
)
from mcp_types.methods import serialize_server_result
from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from handles.console.operations import cursor_of, parse_cursor
from handles.errors import CallerError
from handles.jobs import JobSpec
from handles.server.endings import ended_answer
from handles.server.envelope import SdkServer
from handles.server.tasks_extension import (
    Ctx,
    TasksExtension,
    as_jsonrpc_errors,
    elicitation_request,
    notification,
    task_fields,
)
from handles.states import Status
from handles.store import InputRequestRecord, JobRecord
from handles.tool_layout import JOB_META_KEY

OLDER_VERSION = "2025-11-25"
RELATED_TASK = "io.modelcontextprotocol/related-task"
ANSWER_METHOD = "io.github.handles/answer"
"""The request a POSTed answer becomes: `{taskId, key, result}` (no `result` for a JSON-RPC error)."""
TAKES_ANSWERS = "io.github.handles/takes-answers"
"""Set in the ASGI scope of the requests `OlderAnswers` passes on: answers POSTed back will land."""
_ID_PREFIX = "io.github.handles/question:"


def question_id(key: str, task_id: str) -> str:
    """The JSON-RPC id `ask` gives question `key` of `task_id`: what the client's answer is taken by."""
    return f"{_ID_PREFIX}{key}:{task_id}"


def asks_questions(ctx: Ctx) -> bool:
    """Whether an answer to a question asked on this request's stream can land: the connection carries it
    back, or `OlderAnswers` takes it from a POST."""
    return ctx.session.can_send_request or (
        isinstance(ctx.request, Request) and TAKES_ANSWERS in ctx.request.scope
    )


async def ask(ctx: Ctx, record: InputRequestRecord, task_id: str, seconds: float) -> dict[str, Any] | None:
    """Ask question `record` on the request's stream: its answer (awaited `seconds` at most) where the connection
    carries it back, else None (written to the dispatcher's stream itself, its answer to come by POST)."""
    params = {**elicitation_request(record)["params"], "_meta": {RELATED_TASK: {"taskId": task_id}}}
    if ctx.session.can_send_request:
        question = ElicitRequest.model_validate({"method": "elicitation/create", "params": params})
        metadata = ServerMessageMetadata(related_request_id=ctx.request_id)
        with contextlib.suppress(MCPError, ValidationError):  # no elicitation there: the handle tools answer
            result = await ctx.session.send_request(question, ElicitResult, seconds, metadata)
            return result.model_dump(by_alias=True, mode="json", exclude_none=True)
        return None
    request = JSONRPCRequest(
        jsonrpc="2.0", id=question_id(record.key, task_id), method="elicitation/create", params=params
    )
    dispatcher = getattr(getattr(ctx.session, "_request_outbound", None), "_dispatcher", None)
    if dispatcher is not None:  # else this SDK has no stream to ask on: the handle tools answer
        await dispatcher._write(request, ServerMessageMetadata(related_request_id=ctx.request_id))
    return None


def answer_request(body: bytes) -> bytes | None:
    """The `ANSWER_METHOD` request a POSTed response to a question `ask` sent becomes; None for any other body."""
    if _ID_PREFIX.encode() not in body:
        return None
    try:
        message = json.loads(body)
    except ValueError:
        return None
    answered = message.get("id") if isinstance(message, dict) and "method" not in message else None
    if not isinstance(answered, str) or not answered.startswith(_ID_PREFIX):
        return None
    key, _, task_id = answered.removeprefix(_ID_PREFIX).partition(":")
    params = {"taskId": task_id, "key": key, "result": message.get("result")}
    return json.dumps({"jsonrpc": "2.0", "id": answered, "method": ANSWER_METHOD, "params": params}).encode()


class OlderAnswers:
    """ASGI middleware: a 2025-11-25 POST answering a question `ask` sent is served as an `ANSWER_METHOD` request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        version = dict(scope.get("headers") or ()).get(b"mcp-protocol-version")
        if scope["type"] != "http" or scope["method"] != "POST" or version != OLDER_VERSION.encode():
            await self.app(scope, receive, send)
            return
        scope = {**scope, TAKES_ANSWERS: True}
        body = await Request(scope, receive).body()
        answer = answer_request(body)
        unread = [{"type": "http.request", "body": answer or body, "more_body": False}]

        async def replay() -> Message:
            return unread.pop() if unread else await receive()

        if answer is None:
            await self.app(scope, replay, send)
            return
        kept: list[Message] = []

        async def keep(message: Message) -> None:
            kept.append(message)

        await self.app(scope, replay, keep)
        if kept and kept[0]["type"] == "http.response.start" and kept[0]["status"] < 300:
            kept = [
                {"type": "http.response.start", "status": 202, "headers": []},
                {"type": "http.response.body"},
            ]
        for message in kept:  # a refusal before the app (a missing token) reaches the client as it is
            await send(message)


CAPABILITY: dict[str, Any] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
PAGE_SIZE = 50
"""Tasks per `tasks/list` page."""
CANCEL_WAIT_SECONDS = 5.0
"""How long `tasks/cancel` waits for a running job to stop before it answers the job's state."""
_RENAMED = {"ttlMs": "ttl", "pollIntervalMs": "pollInterval"}


def older_task(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A task of the extension (`task_fields`) in this design's names: `ttl` and `pollInterval`, in ms."""
    return {_RENAMED.get(key, key): value for key, value in fields.items() if key != "resultType"}


def serve_tasks(tasks: TasksExtension, server: SdkServer) -> None:
    """Join `server`'s middleware (once each): the extension's pushed status and this design's face."""
    if tasks.status_push not in server.middleware:
        server.middleware.append(tasks.status_push)
    if not any(isinstance(middleware, OlderTasks) for middleware in server.middleware):
        server.middleware.append(OlderTasks(tasks))


class OlderTasks:
    """The 2025-11-25 design's capability, tool marks (`execution.taskSupport`), task creation and `tasks/*`
    methods, `tasks/result` asking the job's questions on its stream."""

    def __init__(self, tasks: TasksExtension) -> None:
        self.tasks = tasks
        self.methods: dict[str, Callable[..., Awaitable[dict[str, Any]]]] = {
            "tasks/get": self.get_task,
            "tasks/result": self.task_result,
            "tasks/list": self.list_tasks,
            "tasks/cancel": self.cancel_task,
            ANSWER_METHOD: self.take_answer,
        }

    async def __call__(self, ctx: Ctx, call_next: CallNext) -> HandlerResult:
        # Every other version's request passes on after one comparison.
        if ctx.protocol_version != OLDER_VERSION and ctx.method != "initialize":
            return await call_next(ctx)
        if ctx.method == "initialize":
            result = await call_next(ctx)
            if isinstance(result, dict) and result.get("protocolVersion") == OLDER_VERSION:
                result["capabilities"] = {**result.get("capabilities", {}), "tasks": CAPABILITY}
            return result
        if ctx.request_id is None:
            return await call_next(ctx)
        params = ctx.params or {}
        if ctx.method in self.methods:
            return await self.methods[ctx.method](ctx, params)
        if ctx.method == "tools/call" and isinstance(params.get("task"), Mapping):
            created = await self.tasks.task_for_call(
                params.get("name", ""), params.get("arguments"), None, ctx, older=True
            )
            if isinstance(created, dict):
                return {"task": older_task(created)}
            if created is not None:
                return created  # a refusal, as the plain tool answers it
        result = await call_next(ctx)
        if ctx.method == "tools/list" and isinstance(result, dict):
            for tool in result.get("tools", []):
                if tool.get("name") in self.tasks.service.specs:
                    plain_call = (tool.get("_meta") or {}).get(JOB_META_KEY, {}).get("plain_call")
                    tool["execution"] = {
                        "taskSupport": "required" if plain_call == "tasks_only" else "optional"
                    }
        return result

    @as_jsonrpc_errors
    async def get_task(self, ctx: Ctx, params: Mapping[str, Any]) -> dict[str, Any]:
        spec, job, task_id = await self.tasks.open_task(ctx, params.get("taskId"))
        return older_task(task_fields(spec, job, task_id))

    @as_jsonrpc_errors
    async def task_result(self, ctx: Ctx, params: Mapping[str, Any]) -> dict[str, Any]:
        """Wait for the job's end (within the server's wait limit) and answer what its plain call would, sending
        each status change and asking each open question on the stream meanwhile."""
        spec, job, task_id = await self.tasks.open_task(ctx, params.get("taskId"))
        service = self.tasks.service
        asks = asks_questions(ctx)
        asked: set[str] = set()
        status = None
        seconds = service.config.max_wait_seconds
        async with contextlib.aclosing(service.versions(job, seconds, past_reports=True)) as versions:
            async for job in versions:
                if job.status != status:
                    status = job.status
                    body = older_task(task_fields(spec, job, task_id))
                    status_change = notification("notifications/tasks/status", body)
                    await ctx.session.send_notification(status_change, ctx.request_id)
                if asks and status == Status.INPUT_REQUIRED.value:
                    await self._ask(ctx, spec, job, task_id, asked, seconds)
        ended = Status(job.status)
        answer = ended_answer(ended, job.result, job.error, job.status_message)
        if answer is None:  # -32000: a server error of this implementation's own (JSON-RPC's reserved range)
            raise MCPError(-32000, f"The task is {ended.value}, with no result yet: call tasks/result again.")
        result = serialize_server_result(
            "tools/call", OLDER_VERSION, answer.model_dump(by_alias=True, mode="json", exclude_none=True)
        )
        result["_meta"] = {**result.get("_meta", {}), RELATED_TASK: {"taskId": task_id}}
        return result

    async def _ask(
        self, ctx: Ctx, spec: JobSpec, job: JobRecord, task_id: str, asked: set[str], seconds: float
    ) -> None:
        """Ask each open question of `job` not yet `asked` on this stream; store an answer carried back."""
        for record in await self.tasks.service.pending_inputs(job):
            if record.key not in asked:
                asked.add(record.key)
                reply = await ask(ctx, record, task_id, seconds)
                if reply is not None:
                    with contextlib.suppress(CallerError):  # refused: asked again on the next tasks/result
                        await self.tasks.store_responses(spec, job, {record.key: reply})

    @as_jsonrpc_errors
    async def take_answer(self, ctx: Ctx, params: Mapping[str, Any]) -> dict[str, Any]:
        """An answer POSTed back to a question `task_result` asked, stored as `tasks/update` stores one."""
        spec, job, _ = await self.tasks.open_task(ctx, params.get("taskId"))
        result = params.get("result")
        if isinstance(result, Mapping):  # a JSON-RPC error (no elicitation here) leaves the question open
            await self.tasks.store_responses(spec, job, {str(params.get("key")): result})
        return {}

    @as_jsonrpc_errors
    async def list_tasks(self, ctx: Ctx, params: Mapping[str, Any]) -> dict[str, Any]:
        """The caller's own unexpired jobs, newest first; `nextCursor` while more remain."""
        cursor = params.get("cursor")
        before = parse_cursor(cursor) if isinstance(cursor, str) else None
        if cursor is not None and before is None:
            raise MCPError(INVALID_PARAMS, "params.cursor must be a nextCursor tasks/list returned.")
        principal = await self.tasks.principal(ctx)
        service = self.tasks.service
        await service.ensure_running()
        store = service.store
        jobs = await store.read(store.repo.list_jobs, principal=principal, before=before, limit=PAGE_SIZE + 1)
        page: list[dict[str, Any]] = []
        for job in jobs[:PAGE_SIZE]:
            spec = service.specs.get(job.kind)
            if spec is not None and job.principal == principal and job.expires_at > service.clock():
                page.append(older_task(task_fields(spec, job, service.handle_of(job))))
        result: dict[str, Any] = {"tasks": page}
        if len(jobs) > PAGE_SIZE:
            result["nextCursor"] = cursor_of(jobs[PAGE_SIZE - 1])
        return result

    @as_jsonrpc_errors
    async def cancel_task(self, ctx: Ctx, params: Mapping[str, Any]) -> dict[str, Any]:
        """The task once cancelled (a running job is given a moment to stop); an ended task is -32602."""
        spec, job, task_id = await self.tasks.open_task(ctx, params.get("taskId"))
        if Status(job.status).is_terminal:
            raise MCPError(INVALID_PARAMS, f"The task already ended ({job.status}); nothing to cancel.")
        service = self.tasks.service
        job = await service.cancel(job)
        job = await service.wait(job, CANCEL_WAIT_SECONDS, lambda job: Status(job.status).is_terminal)
        return older_task(task_fields(spec, job, task_id))
