"""handles: durable, portable long-running MCP tools.

What a server author imports is here (imported on first use); a client author imports `handles.client`,
and the errors a caller can see are in `handles.errors`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from handles import deprecations

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

deprecations.install()


def _installed_version() -> str:
    """The version in the installed distribution's metadata (pyproject.toml's); `0+unknown` for a checkout
    imported without being installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mcp-handles")
    except PackageNotFoundError:
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        globals()[name] = installed = _installed_version()
        return installed
    module = _EXPORTS.get(name)
    if module is None:
        if name in deprecations.MOVED_NAMES:
            globals()[name] = value = deprecations.moved_name(name)
            return value
        raise AttributeError(f"module 'handles' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
