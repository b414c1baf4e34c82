"""handles: durable, portable long-running MCP tools.

What a server author imports is here (imported on first use); a client author imports `handles.client`,
and the errors a caller can see are in `handles.errors`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from handles.app import Handles
    from handles.ask_first import AskFirst
    from handles.config import HandlesConfig
    from handles.errors import ConfigurationError, HandlesError, JobFailed, StepOutcomeUnknown
    from handles.jobs import JobContext, JobSpec
    from handles.results import ResultFile, ResultLink
    from handles.server.serving import serve_http, serve_stdio, streamable_http_app
    from handles.states import Status

    __version__: str

_EXPORTS = {
    # define jobs and bind them
    "Handles": "handles.app",
    "JobContext": "handles.jobs",
    "JobSpec": "handles.jobs",
    "AskFirst": "handles.ask_first",
    "ResultFile": "handles.results",
    "ResultLink": "handles.results",
    "Status": "handles.states",
    "HandlesConfig": "handles.config",
    # serve them
    "serve_http": "handles.server.serving",
    "serve_stdio": "handles.server.serving",
    "streamable_http_app": "handles.server.serving",
    # what a job raises, and what start-up raises
    "JobFailed": "handles.errors",
    "StepOutcomeUnknown": "handles.errors",
    "ConfigurationError": "handles.errors",
    "HandlesError": "handles.errors",
}

__all__ = [
    "AskFirst",
    "ConfigurationError",
    "Handles",
    "HandlesConfig",
    "HandlesError",
    "JobContext",
    "JobFailed",
    "JobSpec",
    "ResultFile",
    "ResultLink",
    "Status",
    "StepOutcomeUnknown",
    "serve_http",
    "serve_stdio",
    "streamable_http_app",
]
assert sorted(__all__) == sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """A name is imported on first use, then kept in the module."""
    value: object
    if name == "__version__":
        # The installed distribution's (pyproject.toml's); `0+unknown` for a checkout not installed.
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version("mcp-handles")
        except PackageNotFoundError:
            value = "0+unknown"
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        raise AttributeError(f"module 'handles' has no attribute {name!r}")
    globals()[name] = value
    return value
