"""Old import paths, kept working for one release with a `DeprecationWarning`."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Sequence

MOVED_MODULES = {
    "handles.mcp": "handles.server.serving",
    "handles.fastmcp_binding": "handles.server.bind_fastmcp",
    "handles.tools": "handles.server.handle_tools",
    "handles.plain": "handles.server.plain_tool",
    "handles.layout": "handles.tool_layout",
    "handles.arguments": "handles.server.argument_gate",
    "handles.envelope": "handles.server.envelope",
    "handles.result_links": "handles.server.result_links",
    "handles.tasks": "handles.server.tasks_extension",
    "handles.health": "handles.server.health",
    "handles.http_server": "handles.server.serving",
    "handles.startup": "handles.server.health",
    "handles.first": "handles.ask_first",
    "handles.service": "handles.job_operations",
    "handles.tasks_client": "handles.client.tasks",
    "handles.transient": "handles.client.transient",
}
"""Old module path -> where it lives now. `handles.mcp`'s public names were the serving helpers."""

MOVED_NAMES = {
    name: "handles.errors"
    for name in (
        "CallerError",
        "DatabaseUnreachable",
        "ExpiredHandle",
        "IdempotencyConflict",
        "InvalidArguments",
        "JobsPaused",
        "LimitReached",
        "StoreUnavailable",
        "UnknownHandle",
        "WrongJobKind",
    )
} | {"ToolError": "mcp.server.mcpserver.exceptions"}
"""Names that left the top-level `handles` -> the module to import them from now."""


def moved_name(name: str) -> object:
    """The value of a name that left `handles`, with a warning that says where it lives now (once a process)."""
    home = MOVED_NAMES[name]
    warnings.warn(
        f"`handles.{name}` is deprecated and goes in the next release; import it from `{home}`",
        DeprecationWarning,
        stacklevel=3,
    )
    errors = importlib.import_module("handles.errors")
    return errors.deprecated_tool_error() if name == "ToolError" else getattr(errors, name)


class _Alias(importlib.abc.Loader):
    """Loads an old module path as the module at its new path (the same object), warning once."""

    def __init__(self, new: str) -> None:
        self.new = new
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        warnings.warn(
            f"`{spec.name}` is deprecated and goes in the next release; import `{self.new}` instead",
            DeprecationWarning,
            stacklevel=2,  # the import system's own frames are skipped: this names the importing line
        )
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        # The import system has just set the old path's spec on the module: it stays the module of its new path.
        module.__spec__ = self.spec


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths in `MOVED_MODULES` (installed on `sys.meta_path` by `handles/__init__.py`)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED_MODULES.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
