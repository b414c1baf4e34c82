"""One error tree. Every error a caller can see says what happened and what to do next."""

from __future__ import annotations

from typing import Any


class HandlesError(Exception):
    """Base of every error this package raises."""


class ConfigurationError(HandlesError):
    """The server is configured in a way that cannot work (raised at start-up, never to a caller)."""


class DatabaseUnreachable(ConfigurationError):
    """The configured database does not answer at start-up: fatal for a command or stdio, waited out by an HTTP node."""


class CallerError(HandlesError):
    """A request the caller can correct. `code` is stable (a subclass names it, and whether the same call
    may work later, `retryable`, in its class statement); `message` and `next_step` are for people and models."""

    code: str = "invalid_request"
    retryable: bool = False

    def __init_subclass__(cls, *, code: str | None = None, retryable: bool = False) -> None:
        super().__init_subclass__()
        cls.code = code or cls.code
        cls.retryable = retryable or cls.retryable

    def __init__(self, message: str, next_step: str, *, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.next_step = next_step
        self.data = data or {}

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"error": self.code, "message": self.message, "next": self.next_step}
        if self.retryable:
            body["retryable"] = True
        body.update(self.data)
        return body


class UnknownHandle(CallerError, code="unknown_handle"):
    """The handle is forged, truncated, signed by a retired key, or another principal's: all look the same."""


class ExpiredHandle(CallerError, code="expired_handle"):
    """The handle is genuine and the caller's, but its job's retention has passed."""


class WrongJobKind(CallerError, code="wrong_job"):
    """The caller's own handle was passed to the tools of another job."""


class InvalidArguments(CallerError, code="invalid_arguments"):
    """Arguments or responses that do not fit the declared schema or limits."""


class IdempotencyConflict(CallerError, code="idempotency_conflict"):
    """The idempotency key was already used for this job with different arguments."""


class LimitReached(CallerError, code="limit_reached", retryable=True):
    """A configured cap (for example active jobs per principal) stops this request for now."""


class JobsPaused(CallerError, code="paused", retryable=True):
    """An operator paused new starts of this job kind; nothing was started, and the same call works later."""

    @classmethod
    def of(cls, job: str, retry_after_seconds: float) -> JobsPaused:
        """The refusal of a start of `job`, telling the caller to try again after `retry_after_seconds`."""
        return cls(
            f"New {job} jobs are paused by the server's operator for now; nothing was started. Jobs already "
            "started are not affected.",
            "This is temporary and not caused by your request: make the same call again, with the same "
            f"arguments, in about {retry_after_seconds:g} s. Meanwhile, jobs you already started can still be "
            "followed with their handles.",
            data={"retry_after_seconds": retry_after_seconds},
        )


class ShuttingDown(CallerError, code="shutting_down", retryable=True):
    """This server node is draining for a restart; the same call succeeds on another node or after it."""


class StoreUnavailable(CallerError, code="store_unavailable", retryable=True):
    """The database cannot be reached; nothing was changed and the same request may be retried."""

    @classmethod
    def now(cls) -> StoreUnavailable:
        """The one answer to a call the database could not serve."""
        return cls(
            "The job store is unavailable right now; nothing was changed.",
            "Retry the same call in a few seconds.",
        )


class LeaseLost(HandlesError):
    """Internal: this runtime no longer holds the job (it ended, or another runtime recovered it)."""


class JobFailed(HandlesError):
    """Raise inside a job to end it `failed` with a message that is safe to show to the caller."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class StepOutcomeUnknown(HandlesError):
    """A durable step started earlier and never recorded an outcome: its effect may have happened."""

    def __init__(self, step: str, started_at: str, attempt: int) -> None:
        super().__init__(
            f"Step {step!r} started at {started_at} (attempt {attempt}) but its outcome was never recorded: "
            "the process stopped in the middle of it. Reconcile it before retrying the job."
        )
        self.step = step
        self.started_at = started_at
        self.attempt = attempt


class UnknownResultLink(CallerError, code="unknown_result_link"):
    """A result link that is made up, another principal's, of a job that is gone, or of a part that does not exist."""
