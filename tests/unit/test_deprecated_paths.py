"""The import paths of the layout before 0.1.0 were kept for that one release, as they warned; they are gone now."""

from __future__ import annotations

import importlib

import pytest

import handles
import handles.errors

OLD_MODULES = ["handles.mcp", "handles.tasks_client", "handles.tasks", "handles.tools", "handles.service"]


@pytest.mark.parametrize("old", OLD_MODULES)
def test_an_old_module_path_no_longer_imports(old: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


@pytest.mark.parametrize("module", [handles, handles.errors])
def test_the_old_tool_error_is_gone(module: object) -> None:
    with pytest.raises(AttributeError):
        module.ToolError  # type: ignore[attr-defined]  # noqa: B018


def test_the_top_level_holds_what_a_server_author_imports_and_no_wire_error() -> None:
    assert set(handles.__all__) == {
        "AskFirst", "ConfigurationError", "Handles", "HandlesConfig", "HandlesError", "JobContext", "JobFailed",
        "JobSpec", "ResultFile", "ResultLink", "Status", "StepOutcomeUnknown", "serve_http", "serve_stdio",
        "streamable_http_app",
    }  # fmt: skip
    for name in handles.__all__:
        assert getattr(handles, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        handles.nothing_here  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(AttributeError):
        handles.UnknownHandle  # type: ignore[attr-defined]  # noqa: B018
