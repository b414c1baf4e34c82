"""The faces a job is followed through: the handle tools, the Tasks extension, and the 2025-11-25 tasks design,
each observing, answering, cancelling and fetching the outcome in the same shape for the `Follower`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    CallToolResult,
    CancelTaskRequest,
    CancelTaskRequestParams,
    CancelTaskResult,
    ElicitRequestParams,
    ElicitResult,
    ErrorData,
    GetTaskPayloadRequest,
    GetTaskPayloadRequestParams,
    GetTaskRequest,
    GetTaskRequestParams,
    GetTaskResult,
)

from handles.client.outcomes import AnswerRejectedError, FollowError, JobLostError, Question, Retryable
from handles.client.tasks import (
    TERMINAL_STATUSES,
    DetailedTask,
    PushedStatus,
    cancel_task,
    get_task,
    update_task,
)
from handles.client.transient import AUTHENTICATION_FAILED, TRANSIENT_MCP_CODES, json_object
from handles.results import link_of, text_of, tool_error_text
from handles.tool_layout import ToolNames

T = TypeVar("T")

_LOST_CODES = frozenset({"unknown_handle", "expired_handle", "wrong_job"})
_RAISED_AS_IS = TRANSIENT_MCP_CODES | {AUTHENTICATION_FAILED}  # retried, or an authentication error


@dataclass
class View:
    """One observation of the job, whichever face it came from."""

    status: str
    message: str | None = None
    done: float | None = None
    total: float | None = None
    questions: dict[str, Question] = field(default_factory=dict)
    poll_ms: float | None = None
    task: DetailedTask | None = None

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL_STATUSES


def caller_error(result: CallToolResult) -> dict[str, Any]:
    """The JSON body of a handle tool's caller error (or its text as the message)."""
    text = text_of(result)
    body = json_object(text)
    return body if body is not None else {"error": "tool_error", "message": text or "The call failed."}


@dataclass(eq=False)
class HandleFace:
    """The handle tools: `<job>_progress` (long-poll), `<job>_respond`, `<job>_cancel`, `<job>_fetch`,
    or the shared `jobs_*` ones of a compact server (the follower read the layout from tools/list)."""

    key: str
    handle: str
    request_timeout: float
    job: str
    names: ToolNames
    """The server's tool layout for the job."""
    pushed = False  # the handle tools long-poll instead

    async def _call(
        self,
        client: Client,
        verb: str,
        arguments: dict[str, Any],
        wait: float = 0.0,
        refused: type[FollowError] = FollowError,
    ) -> dict[str, Any]:
        """Call `<job>_<verb>` on the handle; a caller error becomes `JobLostError`, a retry, or `refused`."""
        result = await client.call_tool(
            self.names.name(self.job, verb),
            {"handle": self.handle, **arguments},
            read_timeout_seconds=wait + self.request_timeout,
        )
        if result.is_error and result.structured_content is None:
            body = caller_error(result)
            if body.get("retryable") and body.get("error") not in _LOST_CODES:
                raise Retryable(str(body.get("message")))
            kind = JobLostError if body.get("error") in _LOST_CODES else refused
            raise kind(str(body.get("message")), key=self.key, handle=self.handle)
        return result.structured_content or {}

    async def observe(self, client: Client, wait: float) -> View:
        data = await self._call(client, "progress", {"wait_seconds": round(wait, 3)}, wait)
        progress = data.get("progress") or {}
        questions = {
            key: Question(key, str(request.get("message", "")), dict(request.get("requested_schema") or {}))
            for key, request in (data.get("input_requests") or {}).items()
        }
        return View(
            status=str(data.get("status")),
            message=data.get("status_message"),
            done=progress.get("done"),
            total=progress.get("total"),
            questions=questions,
            poll_ms=data.get("poll_after_ms"),
        )

    async def answer(self, client: Client, answers: dict[str, dict[str, Any]]) -> None:
        await self._call(client, "respond", {"responses": answers}, refused=AnswerRejectedError)

    async def decline(self, client: Client, keys: list[str]) -> None:
        # The handle tools have no "declined" answer: a job cannot go on without it, so it is cancelled.
        await self.cancel(client)

    async def cancel(self, client: Client) -> None:
        await self._call(client, "cancel", {})

    async def outcome(self, client: Client, view: View) -> dict[str, Any]:
        data = await self._call(client, "fetch", {"wait_seconds": 0})
        status = str(data.get("status"))
        if status == "completed":
            if data.get("tool_error") is not None:
                return {"status": status, "tool_error": data["tool_error"]}
            # A result too large to travel inline is its link (read it with `read_link`).
            return {"status": status, "result": data.get("result") or data.get("result_link")}
        return ended(status, data.get("status_message"), data.get("error"))


@dataclass(eq=False)
class TaskFace:
    """The Tasks extension: `tasks/get`, `tasks/update`, `tasks/cancel` on the handle as `taskId`, and the
    task's `notifications/tasks` while `status` says the server pushes them."""

    key: str
    handle: str
    request_timeout: float
    status: PushedStatus | None = field(init=False, default=None)

    @property
    def pushed(self) -> bool:
        return self.status is not None and self.status.pushed

    def _lost(self, error: MCPError) -> Exception:
        """What a failed task request raises: the error itself when it is retried or refused, else the job lost."""
        if error.error.code in _RAISED_AS_IS:
            return error
        kind = JobLostError if error.error.code == INVALID_PARAMS else FollowError
        return kind(error.error.message, key=self.key, handle=self.handle)

    async def _request(self, sent: Awaitable[T]) -> T:
        """The answer to the request `sent`, its failure raised as `_lost` says."""
        try:
            return await sent
        except MCPError as error:
            raise self._lost(error) from None

    async def observe(self, client: Client, wait: float) -> View:
        task = None if self.status is None else await self.status.wait_push(wait)
        if task is None:
            task = await self._request(get_task(client.session, self.handle, timeout=self.request_timeout))
        # A handles server only asks form elicitations (`elicitation/create`, message + requestedSchema).
        questions = {
            key: Question(
                key,
                str((request.get("params") or {}).get("message", "")),
                dict((request.get("params") or {}).get("requestedSchema") or {}),
            )
            for key, request in (task.input_requests or {}).items()
        }
        return View(
            status=task.status,
            message=task.status_message,
            done=task.done,
            total=task.total,
            questions=questions,
            poll_ms=task.poll_interval_ms,
            task=task,
        )

    async def _update(self, client: Client, responses: dict[str, Any]) -> None:
        try:
            await update_task(client.session, self.handle, responses, timeout=self.request_timeout)
        except MCPError as error:
            if error.error.code == INVALID_PARAMS:
                await self.observe(client, 0.0)  # the same code for a vanished task: this raises JobLostError
                raise AnswerRejectedError(error.error.message, key=self.key, handle=self.handle) from None
            raise self._lost(error) from None

    async def answer(self, client: Client, answers: dict[str, dict[str, Any]]) -> None:
        await self._update(client, {k: {"action": "accept", "content": v} for k, v in answers.items()})

    async def decline(self, client: Client, keys: list[str]) -> None:
        await self._update(client, {k: {"action": "decline"} for k in keys})

    async def cancel(self, client: Client) -> None:
        await self._request(cancel_task(client.session, self.handle, timeout=self.request_timeout))

    async def outcome(self, client: Client, view: View) -> dict[str, Any]:
        task = view.task
        assert task is not None
        if task.status == "completed":
            return completed(task.result or {})
        return ended(task.status, task.status_message, task.error)


@dataclass(eq=False)
class OlderTaskFace(TaskFace):
    """The experimental Tasks design of MCP 2025-11-25: `tasks/get`, `tasks/cancel`, and `tasks/result`,
    whose stream asks the job's questions, answered through `ask` while it waits."""

    long_poll: float
    ask: Callable[[Question], Awaitable[dict[str, Any] | None]]
    """The follower's `ask`: the caller's answer to a question (None declines)."""
    _ended: CallToolResult | MCPError | None = field(init=False, default=None)
    """What tasks/result answered, once the job ended."""

    async def _send(self, client: Client, request: Any, answer: type[Any]) -> Any:
        return await self._request(client.session.send_request(request, answer, self.request_timeout))

    async def observe(self, client: Client, wait: float) -> View:
        get = GetTaskRequest(params=GetTaskRequestParams(task_id=self.handle))
        task: GetTaskResult = await self._send(client, get, GetTaskResult)
        if task.status == "input_required":
            self._ended = await self._result(client)  # answers the questions, then waits for the end
            task = await self._send(client, get, GetTaskResult)
        if task.status not in TERMINAL_STATUSES:
            self._ended = None  # the server's wait ran out first
        return View(task.status, task.status_message, poll_ms=task.poll_interval)

    async def _result(self, client: Client) -> CallToolResult | MCPError:
        """`tasks/result`, each question on its stream answered through `ask` (what it
        raises, such as `InputRequiredError`, ends the request and is raised)."""
        session = client.session
        stopped: list[FollowError] = []

        async def answer(
            context: ClientRequestContext, params: ElicitRequestParams
        ) -> ElicitResult | ErrorData:
            schema = dict(getattr(params, "requested_schema", None) or {})
            try:
                reply = await self.ask(Question(str(context.request_id), params.message, schema))
            except FollowError as error:
                stopped.append(error)
                scope.cancel()
                return ErrorData(code=INVALID_PARAMS, message=str(error))
            return (
                ElicitResult(action="decline")
                if reply is None
                else ElicitResult(action="accept", content=reply)
            )

        request = GetTaskPayloadRequest(params=GetTaskPayloadRequestParams(task_id=self.handle))
        previous, session._elicitation_callback = session._elicitation_callback, answer
        try:
            with anyio.CancelScope() as scope:
                result: CallToolResult = await session.send_request(
                    request, CallToolResult, self.long_poll + self.request_timeout
                )
                return result
        except MCPError as error:
            if error.error.code == AUTHENTICATION_FAILED:
                raise
            return error  # the job's own error, or a lost wait: the next tasks/get tells
        finally:
            session._elicitation_callback = previous
        raise stopped[0]

    async def cancel(self, client: Client) -> None:
        cancel = CancelTaskRequest(params=CancelTaskRequestParams(task_id=self.handle))
        await self._send(client, cancel, CancelTaskResult)

    async def outcome(self, client: Client, view: View) -> dict[str, Any]:
        if view.status == "cancelled":
            return ended(view.status, view.message)
        # A stored error may be a wait that ran out just before the end: only a result is kept.
        answer = self._ended if isinstance(self._ended, CallToolResult) else await self._result(client)
        if isinstance(answer, CallToolResult):
            return completed(answer.model_dump(by_alias=True, mode="json", exclude_none=True))
        if view.status == "failed":
            return ended(view.status, view.message, answer.error.model_dump(mode="json", exclude_none=True))
        raise self._lost(answer)


def completed(result: dict[str, Any]) -> dict[str, Any]:
    """The outcome of a job that ended `completed` with `result`, a `CallToolResult` dict: its structured
    content, else its link when it is a large result (read it with `read_link`), else the whole result."""
    if result.get("isError"):
        return {"status": "completed", "tool_error": tool_error_text(result)}
    structured = result.get("structuredContent")
    if structured is None and (link := link_of(result)) is not None:
        structured = link.model_dump(mode="json")
    return {"status": "completed", "result": result if structured is None else structured}


def ended(status: str, message: str | None, error: dict[str, Any] | None = None) -> dict[str, Any]:
    """The outcome of a job that ended `cancelled`, or `failed` with `error` (else an internal one saying `message`)."""
    if status != "failed":
        return {"status": status, "message": message}
    return {
        "status": status,
        "error": error or {"code": INTERNAL_ERROR, "message": message or "The job failed."},
    }


Face = HandleFace | TaskFace
