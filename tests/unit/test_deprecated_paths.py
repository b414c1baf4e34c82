"""The layout of earlier releases keeps working for one release, and says where each thing lives now."""

from __future__ import annotations

import importlib
import sys

import pytest

from handles.deprecations import MOVED_MODULES, MOVED_NAMES


@pytest.mark.parametrize(("old", "new"), sorted(MOVED_MODULES.items()))
def test_an_old_module_path_imports_the_module_at_its_new_path_and_warns(old: str, new: str) -> None:
    sys.modules.pop(old, None)  # as if imported for the first time
    with pytest.warns(DeprecationWarning) as caught:
        __import__(old)  # as an import statement does (importlib.import_module would be the importing line)
    module = sys.modules[old]
    assert module is importlib.import_module(new)
    assert module.__spec__ is not None and module.__spec__.name == new  # still the module of its new path
    assert [str(w.message) for w in caught] == [
        f"`{old}` is deprecated and goes in the next release; import `{new}` instead"
    ]
    assert caught[0].filename == __file__  # the warning names the importing line, not the import system


def test_the_old_serving_module_still_offers_the_serving_helpers() -> None:
    import handles

    sys.modules.pop("handles.mcp", None)
    handles.__dict__.pop("mcp", None)  # as if never imported
    with pytest.warns(DeprecationWarning, match="import `handles.server.serving` instead"):
        from handles import mcp as old  # type: ignore[attr-defined]
    assert old.serve_http is handles.serve_http and old.streamable_http_app is handles.streamable_http_app


@pytest.mark.parametrize("name", sorted(set(MOVED_NAMES) - {"ToolError"}))
def test_a_wire_error_that_left_the_top_level_still_resolves_there_and_warns(name: str) -> None:
    import handles
    import handles.errors

    handles.__dict__.pop(name, None)  # as if first used here
    with pytest.warns(DeprecationWarning, match="import it from `handles.errors`"):
        value = getattr(handles, name)
    assert value is getattr(handles.errors, name)


def test_the_old_tool_error_is_the_sdks_tool_error() -> None:
    from mcp.server.mcpserver.exceptions import ToolError

    import handles

    handles.__dict__.pop("ToolError", None)
    with pytest.warns(DeprecationWarning, match="mcp.server.mcpserver.exceptions"):
        old = handles.ToolError
    assert issubclass(old, ToolError) and issubclass(old, handles.HandlesError)
    assert old("the message").message == "the message"


def test_the_top_level_holds_what_a_server_author_imports_and_no_wire_error() -> None:
    import handles

    assert set(handles.__all__) == {
        "AskFirst", "ConfigurationError", "Handles", "HandlesConfig", "HandlesError", "JobContext", "JobFailed",
        "JobSpec", "ResultFile", "ResultLink", "Status", "StepOutcomeUnknown", "serve_http", "serve_stdio",
        "streamable_http_app",
    }  # fmt: skip
    for name in handles.__all__:
        assert getattr(handles, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        handles.nothing_here  # noqa: B018
