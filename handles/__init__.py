"""handles: durable, portable long-running MCP tools.

One async function becomes `<job>_start`, `<job>_progress`, `<job>_fetch`,
`<job>_cancel` (and `<job>_respond`) tools sharing a signed, principal-bound
handle, on durable SQL state; in the compact layout (`bind(server, layout="compact")`)
one shared `jobs_progress`, `jobs_fetch`, `jobs_cancel` (and `jobs_respond`) serve
every job.

Names are imported on first use, so `handles.cli` and the store stay quick to load.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from handles.app import Handles
    from handles.config import HandlesConfig
    from handles.errors import (
        CallerError,
        ConfigurationError,
        DatabaseUnreachable,
        ExpiredHandle,
        HandlesError,
        IdempotencyConflict,
        InvalidArguments,
        JobFailed,
        JobsPaused,
        LimitReached,
        StepOutcomeUnknown,
        StoreUnavailable,
        ToolError,
        UnknownHandle,
        WrongJobKind,
    )
    from handles.first import AskFirst
    from handles.jobs import JobContext, JobSpec
    from handles.results import ResultFile, ResultLink
    from handles.states import Status

_EXPORTS = {
    "AskFirst": "handles.first",
    "Handles": "handles.app",
    "HandlesConfig": "handles.config",
    "JobContext": "handles.jobs",
    "JobSpec": "handles.jobs",
    "ResultFile": "handles.results",
    "ResultLink": "handles.results",
    "Status": "handles.states",
    **{
        name: "handles.errors"
        for name in (
            "CallerError",
            "ConfigurationError",
            "DatabaseUnreachable",
            "ExpiredHandle",
            "HandlesError",
            "IdempotencyConflict",
            "InvalidArguments",
            "JobFailed",
            "JobsPaused",
            "LimitReached",
            "StepOutcomeUnknown",
            "StoreUnavailable",
            "ToolError",
            "UnknownHandle",
            "WrongJobKind",
        )
    },
}

__all__ = [
    "AskFirst",
    "CallerError",
    "ConfigurationError",
    "DatabaseUnreachable",
    "ExpiredHandle",
    "Handles",
    "HandlesConfig",
    "HandlesError",
    "IdempotencyConflict",
    "InvalidArguments",
    "JobContext",
    "JobFailed",
    "JobSpec",
    "JobsPaused",
    "LimitReached",
    "ResultFile",
    "ResultLink",
    "Status",
    "StepOutcomeUnknown",
    "StoreUnavailable",
    "ToolError",
    "UnknownHandle",
    "WrongJobKind",
]
assert sorted(__all__) == sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'handles' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
