"""The Tasks extension (2026-07-28) on the SDK's `Extension` seam; a task's `taskId` is its job's handle."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, cast

import anyio
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import Context
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_NAME_HEADER, decode_header_value
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY
from mcp_types import (
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    CallToolRequestParams,
    CallToolResult,
    ClientCapabilities,
    InputRequiredResult,
    MissingRequiredClientCapabilityErrorData,
    Notification,
    RequestParams,
    ServerNotification,
    SubscriptionFilter,
    SubscriptionsAcknowledgedNotification,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.requests import Request

from handles.errors import (
    CallerError,
    ExpiredHandle,
    InvalidArguments,
    StoreUnavailable,
    UnknownHandle,
    WrongJobKind,
)
from handles.jobs import JobSpec
from handles.server.bind_mcpserver import resolve_principal
from handles.server.endings import cancel_orphaned, outcome_answer, start_call
from handles.server.tool_shapes import refusal
from handles.states import Status
from handles.store import InputRequestRecord, JobRecord
from handles.tasks_wire import PROGRESS_META_KEY, TASKS_EXTENSION

if TYPE_CHECKING:
    from handles.job_operations import JobOperations
    from handles.principal import PrincipalResolver

UNKNOWN_TASK = (
    "Unknown task: no task with this taskId is available to you. It may be mistyped, expired and "
    "deleted after its ttlMs, or issued to someone else."
)
MAX_LISTEN_TASK_IDS = 1000
"""The most `taskIds` one `subscriptions/listen` may name (more is refused with -32602)."""
logger = logging.getLogger("handles.server.tasks_extension")
Ctx = ServerRequestContext[Any, Any]
_ELICITATION_ACTIONS = ("accept", "decline", "cancel")


class TaskParams(RequestParams):
    """`{taskId}` (and `inputResponses` for `tasks/update`), typed loosely so a malformed value is refused
    after the capability gate, as -32602."""

    task_id: Any = None
    input_responses: Any = None


def declares_tasks(ctx: Ctx) -> bool:
    """Whether this request declared the extension (only 2026-07-28 requests can; capabilities are per request)."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    capabilities = ctx.session.client_capabilities
    return bool(capabilities and capabilities.extensions and TASKS_EXTENSION in capabilities.extensions)


def require_tasks(ctx: Ctx, what: str) -> None:
    """-32021 unless this request declared the extension: `what` needs it."""
    if not declares_tasks(ctx):
        raise missing_tasks_capability(
            f"{what} needs the {TASKS_EXTENSION} extension: declare it in this request's "
            "_meta clientCapabilities.extensions."
        )


def missing_tasks_capability(message: str) -> MCPError:
    """`-32021` naming the extension in `data.requiredCapabilities`."""
    data = MissingRequiredClientCapabilityErrorData(
        required_capabilities=ClientCapabilities(extensions={TASKS_EXTENSION: {}})
    )
    return MCPError(
        code=MISSING_REQUIRED_CLIENT_CAPABILITY,
        message=message,
        data=data.model_dump(by_alias=True, mode="json", exclude_none=True),
    )


def iso_time(moment: datetime) -> str:
    """ISO 8601 in UTC with a `Z`, millisecond precision."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _status_message(job: JobRecord) -> str | None:
    if job.status_message:
        return job.status_message
    if job.progress_done is not None:
        total = f" of {job.progress_total:g}" if job.progress_total else ""
        return f"{job.progress_done:g}{total} done."
    return None


def task_fields(spec: JobSpec, job: JobRecord, task_id: str, status: Status | None = None) -> dict[str, Any]:
    """The `Task` base shape, in `status` (default: the job's). `ttlMs` is the job's retention, counted from
    `createdAt` as the spec says."""
    status = status or Status(job.status)
    fields: dict[str, Any] = {"taskId": task_id, "status": status.value}
    message = _status_message(job)
    if message:
        fields["statusMessage"] = message
    fields["createdAt"] = iso_time(job.created_at)
    fields["lastUpdatedAt"] = iso_time(job.updated_at)
    fields["ttlMs"] = int((job.expires_at - job.created_at).total_seconds() * 1000)
    if not status.is_terminal:
        fields["pollIntervalMs"] = spec.poll_after_ms
    return fields


def elicitation_request(record: InputRequestRecord) -> dict[str, Any]:
    """One stored question as an MRTR `elicitation/create` input request (form mode)."""
    return {
        "method": "elicitation/create",
        "params": {"mode": "form", "message": record.message, "requestedSchema": record.requested_schema},
    }


def detailed_task(
    spec: JobSpec, job: JobRecord, task_id: str, pending: Sequence[InputRequestRecord]
) -> dict[str, Any]:
    """The `tasks/get` answer: `resultType: "complete"`, the task, and what its status carries."""
    status = Status(job.status)
    if status is Status.INPUT_REQUIRED and not pending:
        status = Status.WORKING  # every question was answered between our two reads: the job is resuming
    body: dict[str, Any] = {"resultType": "complete", **task_fields(spec, job, task_id, status)}
    if status is Status.INPUT_REQUIRED:
        body["inputRequests"] = {record.key: elicitation_request(record) for record in pending}
    elif status is Status.COMPLETED:
        body["result"] = job.result or {
            "content": [{"type": "text", "text": "The job completed without a stored result."}],
            "isError": True,
        }
    elif status is Status.FAILED:
        error = job.error or {"code": INTERNAL_ERROR, "message": job.status_message or "The job failed."}
        body["error"] = error
        body.setdefault("statusMessage", str(error.get("message") or "The job failed."))
    if job.progress_done is not None:
        progress = {"done": job.progress_done}
        if job.progress_total is not None:
            progress["total"] = job.progress_total
        body["_meta"] = {PROGRESS_META_KEY: progress}
    return body


TaskHandler = Callable[[Any, Ctx, Any], Awaitable[dict[str, Any]]]


def as_jsonrpc_errors(handler: TaskHandler) -> TaskHandler:
    """The handler, its caller errors raised as JSON-RPC errors (`jsonrpc_error`)."""

    @functools.wraps(handler)
    async def guarded(self: Any, ctx: Ctx, params: Any) -> dict[str, Any]:
        try:
            return await handler(self, ctx, params)
        except CallerError as error:
            raise jsonrpc_error(error) from None

    return guarded


def jsonrpc_error(error: CallerError) -> MCPError:
    """A caller error on the Tasks faces: a vanished job is the one -32602, a store outage -32603."""
    if isinstance(error, UnknownHandle | ExpiredHandle | WrongJobKind):
        return MCPError(INVALID_PARAMS, UNKNOWN_TASK)
    if isinstance(error, InvalidArguments):
        return MCPError(INVALID_PARAMS, error.message)
    return MCPError(INTERNAL_ERROR, f"{error.message} {error.next_step}")


class ServedJobs(Protocol):
    """What the Tasks face needs of the jobs it serves: `Handles` is one (not imported: it imports this)."""

    principal_resolver: PrincipalResolver

    @property
    def service(self) -> JobOperations: ...

    @property
    def specs(self) -> Mapping[str, JobSpec]: ...


class TasksExtension(Extension):
    """Serves every job of a `Handles` instance through the Tasks extension; pass it to the server at construction."""

    identifier = TASKS_EXTENSION

    def __init__(self, handles: ServedJobs) -> None:
        self._handles = handles

    @property
    def service(self) -> JobOperations:
        return self._handles.service

    async def principal(self, ctx: Ctx) -> str:
        """Who makes this request, as the jobs' principal resolver says."""
        return await resolve_principal(self._handles.principal_resolver, Context(request_context=ctx))

    def methods(self) -> Sequence[MethodBinding]:
        # Bound at every version so a handshake-era client is told -32021 (it cannot declare the
        # extension), not -32601. tasks/result and tasks/list are not bound: the SDK answers -32601.
        return (
            MethodBinding("tasks/get", TaskParams, self.get_task),
            MethodBinding("tasks/update", TaskParams, self.update_task),
            MethodBinding("tasks/cancel", TaskParams, self.cancel_task),
        )

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: Ctx, call_next: CallNext
    ) -> HandlerResult:
        """A declaring call of a job's plain tool becomes a task; everything else passes through."""
        outcome = await self.task_for_call(params.name, params.arguments, params.input_responses, ctx)
        return await call_next(ctx) if outcome is None else outcome

    async def task_for_call(
        self,
        name: str,
        arguments: Mapping[str, Any] | None,
        input_responses: Any,
        ctx: Ctx,
        *,
        older: bool = False,
    ) -> dict[str, Any] | CallToolResult | InputRequiredResult | None:
        """What a `tools/call` of `name` answers on the Tasks face, or None when the plain tool should answer it;
        `older`: a 2025-11-25 call asking for a task, never answered inline."""
        spec = self._handles.specs.get(name)
        if spec is None or not (older or declares_tasks(ctx)):
            return None
        try:
            if await self.service.tasks_stopped():
                # The kill switch: no new task; the plain tool answers (existing tasks are still served).
                return None
        except CallerError as error:
            return refusal(error)
        # A job with `task_after` answers inline if its run here ends that soon (the outcome it stored).
        settled = None if spec.task_after is None or older else asyncio.get_running_loop().create_future()
        started = await start_call(
            self.service,
            spec,
            await self.principal(ctx),
            dict(arguments or {}),
            ctx,
            input_responses,
            settled=settled,
            face="tasks_2025_11_25" if older else "tasks_extension",
        )
        if isinstance(started, CallToolResult | InputRequiredResult):
            return started  # the question before the job, or a refusal
        if settled is not None and spec.task_after is not None and started.job.lease_owner is not None:
            # Only a job claimed at its insert runs here at once: no other can end within the wait. One that
            # ends (its run here stores the outcome) within `task_after` is answered inline.
            try:
                await asyncio.wait({settled}, timeout=spec.task_after.total_seconds())
            except anyio.get_cancelled_exc_class():
                await cancel_orphaned(self.service, started.job)
                raise
            if settled.done():
                return outcome_answer(settled.result())
        return {"resultType": "task", **task_fields(spec, started.job, started.handle)}  # `CreateTaskResult`

    async def _open(self, ctx: Ctx, params: TaskParams) -> tuple[JobSpec, JobRecord, str]:
        """Routing header, capability gate, then the caller's own job, or one -32602 for every miss."""
        task_id = params.task_id
        if isinstance(task_id, str):
            _check_routing_header(ctx, task_id)
        require_tasks(ctx, ctx.method)
        return await self.open_task(ctx, task_id)

    async def open_task(self, ctx: Ctx, task_id: Any) -> tuple[JobSpec, JobRecord, str]:
        """The caller's own job for `task_id`; every miss raises what `as_jsonrpc_errors` turns into one -32602."""
        if not isinstance(task_id, str) or not task_id:
            raise MCPError(INVALID_PARAMS, "params.taskId must be the taskId string the server returned.")
        spec, job = await self.service.open_any(await self.principal(ctx), task_id)
        return spec, job, task_id

    @as_jsonrpc_errors
    async def get_task(self, ctx: Ctx, params: TaskParams) -> dict[str, Any]:
        spec, job, task_id = await self._open(ctx, params)
        pending = await self.service.pending_inputs(job)
        return detailed_task(spec, job, task_id, pending)

    @as_jsonrpc_errors
    async def update_task(self, ctx: Ctx, params: TaskParams) -> dict[str, Any]:
        """Store accepted answers (all or none); a declined or dismissed question cancels the job."""
        spec, job, _ = await self._open(ctx, params)
        responses = params.input_responses
        if not isinstance(responses, dict):
            raise MCPError(
                INVALID_PARAMS,
                'params.inputResponses must be an object: {"<key>": {"action": "accept", "content": {...}}}.',
            )
        await self.store_responses(spec, job, responses)
        return {"resultType": "complete"}

    async def store_responses(self, spec: JobSpec, job: JobRecord, responses: Mapping[str, Any]) -> None:
        """Store the accepted answers among `responses` (all or none); a declined or dismissed question cancels
        the job, and keys of no open question are ignored."""
        pending = {record.key for record in await self.service.pending_inputs(job)}
        answers: dict[str, Any] = {}
        refused = False
        for key, response in responses.items():
            if key not in pending:
                continue
            action = response.get("action") if isinstance(response, dict) else None
            if action not in _ELICITATION_ACTIONS:
                raise MCPError(
                    INVALID_PARAMS,
                    f'inputResponses["{key}"] must be an elicitation result: '
                    '{"action": "accept" | "decline" | "cancel", "content": {...}}.',
                )
            if action != "accept":
                refused = True
                continue
            content = response.get("content")
            if content is not None and not isinstance(content, dict):
                raise MCPError(INVALID_PARAMS, f'inputResponses["{key}"].content must be an object.')
            answers[key] = content or {}
        if answers:
            await self.service.respond(spec, job, answers)
        if refused:
            # A job cannot go on without its answer, and ask() has no "declined" outcome to return.
            await self.service.cancel(job)

    @as_jsonrpc_errors
    async def cancel_task(self, ctx: Ctx, params: TaskParams) -> dict[str, Any]:
        """Cooperative and eventually consistent; the same empty ack for an already finished task."""
        _, job, _ = await self._open(ctx, params)
        await self.service.cancel(job)
        return {"resultType": "complete"}

    async def status_push(self, ctx: Ctx, call_next: CallNext) -> HandlerResult:
        """Server middleware serving `notifications.taskIds` on `subscriptions/listen`: `notifications/tasks`
        for the caller's own tasks among them, at once and on every change on any node, until each ends."""
        if ctx.method != "subscriptions/listen" or ctx.request_id is None:
            return await call_next(ctx)
        requested = requested_task_ids(ctx.params)
        if requested is None:
            return await call_next(ctx)
        require_tasks(ctx, "notifications.taskIds on subscriptions/listen")
        principal = await self.principal(ctx)
        opened: list[tuple[JobSpec, JobRecord, str]] = []
        for task_id in requested:
            try:
                spec, job = await self.service.open_any(principal, task_id)
            except (UnknownHandle, ExpiredHandle, WrongJobKind):
                continue  # unknown, expired and foreign alike: left out, nothing said
            except CallerError as error:
                raise jsonrpc_error(error) from None
            opened.append((spec, job, task_id))
        # Read before the acknowledgement: each pusher starts from this version, so a change that lands
        # between the acknowledgement and the pusher's first read is still pushed.
        tap = _AckTap(ctx.session, [task_id for _, _, task_id in opened])
        async with anyio.create_task_group() as pushers:
            for spec, job, task_id in opened:
                pushers.start_soon(self._push, tap, ctx.request_id, spec, job, task_id)
            try:
                result = await call_next(dataclasses.replace(ctx, session=cast(ServerSession, tap)))
            finally:
                pushers.cancel_scope.cancel()
        return result

    async def _push(
        self, tap: _AckTap, subscription_id: Any, spec: JobSpec, job: JobRecord, task_id: str
    ) -> None:
        """Push the task's state after the acknowledgement, then each new version, until it ends."""
        await tap.acked.wait()
        service = self.service
        try:
            async with contextlib.aclosing(
                service.versions(job, outage_pause=service.config.store_poll_seconds)
            ) as changes:
                async for record in changes:
                    pending = await service.pending_inputs(record)
                    # The `tasks/get` answer without `resultType`, stamped with the subscription id.
                    params = detailed_task(spec, record, task_id, pending)
                    del params["resultType"]
                    params["_meta"] = {**params.get("_meta", {}), SUBSCRIPTION_ID_META_KEY: subscription_id}
                    await tap.send_notification(notification("notifications/tasks", params), subscription_id)
        except StoreUnavailable:
            logger.warning("stopped pushing a task's status: the store is unavailable")
        except Exception:  # one task's pusher must not end the stream it shares
            logger.exception("stopped pushing a task's status")


def _check_routing_header(ctx: Ctx, task_id: str) -> None:
    """Over 2026-07-28 Streamable HTTP, an `Mcp-Name` header that is present must carry `params.taskId`
    (whitespace aside), else `-32020`."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS or not isinstance(ctx.request, Request):
        return
    raw = ctx.request.headers.get(MCP_NAME_HEADER)
    if raw is None:
        return
    decoded = decode_header_value(raw)
    if decoded is None or decoded.strip() != task_id.strip():
        raise MCPError(HEADER_MISMATCH, f"{MCP_NAME_HEADER} header does not match params.taskId")


def notification(method: str, params: dict[str, Any]) -> ServerNotification:
    """A notification the SDK's types do not list (`notifications/tasks`, or the 2025-11-25 design's)."""
    return cast(ServerNotification, Notification[dict[str, Any], str](method=method, params=params))


class _AckTap:
    """The listen request's session as the SDK's `ListenHandler` sees it: adds the honored `taskIds` to the
    acknowledgement and tells the pushers once it is out."""

    def __init__(self, session: ServerSession, task_ids: list[str]) -> None:
        self._session = session
        self._task_ids = task_ids
        self.acked = anyio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    async def send_notification(
        self, notification: ServerNotification, related_request_id: Any = None
    ) -> None:
        if isinstance(notification, SubscriptionsAcknowledgedNotification) and not self.acked.is_set():
            honored = notification.params.notifications.model_dump(by_alias=True, exclude_none=True)
            if self._task_ids:
                honored["taskIds"] = list(self._task_ids)
            params = notification.params.model_copy(
                update={"notifications": SubscriptionFilter.model_validate(honored)}
            )
            await self._session.send_notification(
                notification.model_copy(update={"params": params}), related_request_id
            )
            self.acked.set()
            return
        await self._session.send_notification(notification, related_request_id)


def requested_task_ids(params: Mapping[str, Any] | None) -> list[str] | None:
    """`params.notifications.taskIds` of a raw `subscriptions/listen` request (None when absent); -32602 when malformed."""
    notifications = (params or {}).get("notifications")
    if not isinstance(notifications, Mapping) or notifications.get("taskIds") is None:
        return None
    task_ids = notifications["taskIds"]
    if not isinstance(task_ids, list) or not all(isinstance(task_id, str) for task_id in task_ids):
        raise MCPError(INVALID_PARAMS, "params.notifications.taskIds must be a list of taskId strings.")
    if len(task_ids) > MAX_LISTEN_TASK_IDS:
        raise MCPError(
            INVALID_PARAMS,
            f"params.notifications.taskIds names {len(task_ids)} tasks; at most {MAX_LISTEN_TASK_IDS} "
            "fit one stream: open several.",
        )
    return list(dict.fromkeys(task_ids))
