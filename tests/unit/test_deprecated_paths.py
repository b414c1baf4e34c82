"""The layout of earlier releases keeps working for one release, and says where each thing lives now."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from handles.deprecations import MOVED_MODULES, MOVED_NAMES


@pytest.mark.parametrize(("old", "new"), sorted(MOVED_MODULES.items()))
def test_an_old_module_path_imports_the_module_at_its_new_path_and_warns(old: str, new: str) -> None:
    # A fresh interpreter, so that the old path is imported for the first time.
    program = (
        "import importlib, warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        f"    old = importlib.import_module({old!r})\n"
        f"new = importlib.import_module({new!r})\n"
        "assert old is new, (old, new)\n"
        "assert new.__spec__.name == new.__name__, new.__spec__\n"
        "print('\\n'.join(f'{w.category.__name__}: {w.message}' for w in caught))\n"
    )
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert f"DeprecationWarning: `{old}` is deprecated" in run.stdout
    assert f"import `{new}` instead" in run.stdout


def test_the_old_serving_module_still_offers_the_serving_helpers() -> None:
    with pytest.warns(DeprecationWarning):
        old = (
            importlib.import_module("handles.mcp")
            if "handles.mcp" not in sys.modules
            else sys.modules["handles.mcp"]
        )
        warnings_ok = True
    import handles

    assert warnings_ok
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
