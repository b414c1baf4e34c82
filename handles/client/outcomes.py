"""What `follow` gives its caller: progress, questions, and the errors it raises."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from handles.client.transient import AuthenticationError

__all__ = [  # what `handles.client` re-exports
    "AnswerRejectedError",
    "AuthenticationRefusedError",
    "ConnectionLostError",
    "DeadlineExceeded",
    "FollowError",
    "InputCallback",
    "InputRequiredError",
    "JobCancelledError",
    "JobFailedError",
    "JobLostError",
    "JobToolError",
    "JournalConflict",
    "OutcomeUnknownError",
    "Progress",
    "ProgressCallback",
    "Question",
    "StartRefusedError",
    "UnsupportedServerError",
]


@dataclass(frozen=True)
class Question:
    """One question a job is waiting on."""

    key: str
    message: str
    requested_schema: dict[str, Any]


@dataclass(frozen=True)
class Progress:
    """What the job reported (`done`, `total`, `message`), given to `on_progress` whenever it changes."""

    key: str
    job: str
    handle: str
    status: str
    message: str | None = None
    done: float | None = None
    total: float | None = None


ProgressCallback = Callable[[Progress], Awaitable[None] | None]
"""Called with each change of status, message or progress (sync or async)."""

InputCallback = Callable[[str, str, dict[str, Any]], Awaitable[dict[str, Any] | None] | dict[str, Any] | None]
"""`(question key, message, requested_schema) -> answer object`, or None to decline (the job is then cancelled)."""


class FollowError(Exception):
    """Base of what `follow` raises. `key` is the journal key; `handle` the job's handle (taskId) when known."""

    def __init__(self, message: str, *, key: str, handle: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.key = key
        self.handle = handle


class JobFailedError(FollowError):
    """The job ended `failed`; `error` is its JSON-RPC error object (`code`, `message`, `data`)."""

    def __init__(self, error: dict[str, Any], *, key: str, handle: str | None) -> None:
        super().__init__(str(error.get("message") or "The job failed."), key=key, handle=handle)
        self.error = error


class JobToolError(FollowError):
    """The job completed with a tool error (`isError: true`): the job's own message, for the caller to act on."""


class JobCancelledError(FollowError):
    """The job ended `cancelled` without a result."""


class DeadlineExceeded(FollowError, TimeoutError):
    """The deadline passed first. Unless `cancelled`, the job goes on: follow the same key again later."""

    def __init__(
        self, message: str, *, key: str, handle: str | None, status: str | None, cancelled: bool
    ) -> None:
        super().__init__(message, key=key, handle=handle)
        self.status = status
        self.cancelled = cancelled


class JobLostError(FollowError):
    """The server no longer knows the handle (expired and deleted, or another principal's). Nothing was restarted."""


class ConnectionLostError(FollowError):
    """The server could not be reached after the allowed retries. The journal keeps the job: follow the key later."""


class AuthenticationRefusedError(FollowError, AuthenticationError):
    """The server answered HTTP 401 or 403 (`status`); not retried, and the journal keeps the job."""

    def __init__(self, error: AuthenticationError, *, key: str, handle: str | None = None) -> None:
        Exception.__init__(self, str(error))  # both bases' fields, set here (their __init__s differ)
        self.message = str(error)
        self.key = key
        self.handle = handle
        self.status = error.status
        self.detail = error.detail


class StartRefusedError(FollowError):
    """The server refused to start the job (invalid arguments, a limit); no job exists. `error` is its answer."""

    def __init__(self, error: dict[str, Any], *, key: str) -> None:
        super().__init__(str(error.get("message") or "The server refused to start the job."), key=key)
        self.error = error


class OutcomeUnknownError(FollowError):
    """A create that cannot be repeated safely may or may not have run: reconcile, then `Journal.forget(key)`."""


class InputRequiredError(FollowError):
    """The job asked a question and no `on_input` was given. `questions` lists them; the job waits."""

    def __init__(self, questions: list[Question], *, key: str, handle: str) -> None:
        keys = ", ".join(q.key for q in questions)
        super().__init__(
            f"The job is waiting for answers to {keys}; pass on_input to answer.", key=key, handle=handle
        )
        self.questions = questions


class AnswerRejectedError(FollowError):
    """The server refused an answer (it does not fit the requested schema)."""


class JournalConflict(FollowError, ValueError):
    """The key is already used in the journal for another server, job or arguments."""


class UnsupportedServerError(FollowError):
    """The server (or this client) offers no way to run or follow this job as asked."""


class Retryable(Exception):
    """Internal: the server said nothing changed and the same request may be sent again."""
