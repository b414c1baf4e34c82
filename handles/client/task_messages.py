"""The Tasks extension's messages as the client sends and reads them, and the errors a task's end raises."""

from __future__ import annotations

from typing import Any, Literal

from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    InputRequest,
    Request,
    RequestParams,
    Result,
)
from pydantic import TypeAdapter

from handles.tasks_wire import PROGRESS_META_KEY

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]
TERMINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "cancelled"})

_INPUT_REQUEST: TypeAdapter[InputRequest] = TypeAdapter(InputRequest)


class TaskResultBase(Result):
    """The `Task` fields shared by `CreateTaskResult` and the `tasks/get` answer."""

    task_id: str
    status: TaskStatus
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None

    @property
    def done(self) -> float | None:
        """Work done so far, when the server reports it under `PROGRESS_META_KEY` (a `handles` server does)."""
        return _progress_number(self.meta, "done")

    @property
    def total(self) -> float | None:
        """The total the job announced with its progress, if any."""
        return _progress_number(self.meta, "total")


def _progress_number(meta: dict[str, Any] | None, name: str) -> float | None:
    progress = (meta or {}).get(PROGRESS_META_KEY)
    value = progress.get(name) if isinstance(progress, dict) else None
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


class CreateTaskResult(TaskResultBase):
    """A `tools/call` answered with a task (flat: the task fields and `resultType: "task"`)."""

    result_type: Literal["task"] = "task"


class DetailedTask(TaskResultBase):
    """A `tasks/get` answer: the task plus what its status carries."""

    result_type: str = "complete"
    input_requests: dict[str, dict[str, Any]] | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None

    def pending_requests(self) -> dict[str, InputRequest]:
        """The outstanding input requests, parsed (empty unless `input_required`)."""
        return {
            key: _INPUT_REQUEST.validate_python(value) for key, value in (self.input_requests or {}).items()
        }


class TaskIdParams(RequestParams):
    task_id: str


class UpdateTaskParams(TaskIdParams):
    input_responses: dict[str, Any]


class GetTaskRequest(Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"  # Streamable HTTP: Mcp-Name carries the taskId


class UpdateTaskRequest(Request[UpdateTaskParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateTaskParams
    name_param = "taskId"


class CancelTaskRequest(Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams
    name_param = "taskId"


class Ack(Result):
    result_type: str = "complete"


class TaskFailed(MCPError):
    """The task ended `failed`: carries its JSON-RPC error (the error the call would have returned)."""

    def __init__(self, task: DetailedTask) -> None:
        error = task.error or {}
        super().__init__(
            code=int(error.get("code", INTERNAL_ERROR)),
            message=str(error.get("message") or task.status_message or "The task failed."),
            data=error.get("data"),
        )
        self.task = task


class TaskCancelled(RuntimeError):
    """The task ended `cancelled` without a result."""

    def __init__(self, task: DetailedTask) -> None:
        super().__init__(task.status_message or "The task was cancelled.")
        self.task = task


async def get_task(session: ClientSession, task_id: str, *, timeout: float | None = None) -> DetailedTask:
    return await session.send_request(
        GetTaskRequest(params=TaskIdParams(task_id=task_id)),
        DetailedTask,
        request_read_timeout_seconds=timeout,
    )


async def update_task(
    session: ClientSession, task_id: str, responses: dict[str, Any], *, timeout: float | None = None
) -> None:
    """Send answers; `responses` maps input-request keys to results (e.g. `ElicitResult`s or plain dicts)."""
    wire = {
        key: value.model_dump(by_alias=True, mode="json", exclude_none=True)
        if isinstance(value, Result)
        else value
        for key, value in responses.items()
    }
    await session.send_request(
        UpdateTaskRequest(params=UpdateTaskParams(task_id=task_id, input_responses=wire)),
        Ack,
        request_read_timeout_seconds=timeout,
    )


async def cancel_task(session: ClientSession, task_id: str, *, timeout: float | None = None) -> None:
    await session.send_request(
        CancelTaskRequest(params=TaskIdParams(task_id=task_id)), Ack, request_read_timeout_seconds=timeout
    )


async def send_unchecked(
    session: ClientSession,
    method: str,
    params: dict[str, Any],
    *,
    timeout: float,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """`method` with `params`, stamped as the session stamps every request (plus `headers`), its answer
    returned as sent: for answers the SDK would check against the wrong shape, such as a 2025-11-25
    `tools/call` answered with a task. Uses the session's private stamp and dispatcher."""
    data: dict[str, Any] = {"method": method, "params": params}
    options: Any = {"timeout": timeout}
    session._stamp(data, options)  # pyright: ignore[reportPrivateUsage]
    if headers:
        options.setdefault("headers", {}).update(headers)
    answer: dict[str, Any] = await session._dispatcher.send_raw_request(  # pyright: ignore[reportPrivateUsage]
        method, data["params"], options
    )
    return answer
