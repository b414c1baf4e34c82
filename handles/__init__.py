"""handles: durable, portable long-running MCP tools.

One async function becomes `<job>_start`, `<job>_progress`, `<job>_fetch`,
`<job>_cancel` (and `<job>_respond`) tools sharing a signed, principal-bound
handle, on durable SQL state.
"""

from handles.app import Handles
from handles.config import HandlesConfig
from handles.errors import (
    CallerError,
    ConfigurationError,
    ExpiredHandle,
    HandlesError,
    IdempotencyConflict,
    InvalidArguments,
    JobFailed,
    LimitReached,
    StepOutcomeUnknown,
    StoreUnavailable,
    ToolError,
    UnknownHandle,
    WrongJobKind,
)
from handles.jobs import JobContext, JobSpec
from handles.states import Status

__all__ = [
    "CallerError",
    "ConfigurationError",
    "ExpiredHandle",
    "Handles",
    "HandlesConfig",
    "HandlesError",
    "IdempotencyConflict",
    "InvalidArguments",
    "JobContext",
    "JobFailed",
    "JobSpec",
    "LimitReached",
    "Status",
    "StepOutcomeUnknown",
    "StoreUnavailable",
    "ToolError",
    "UnknownHandle",
    "WrongJobKind",
]
