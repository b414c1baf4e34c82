"""`handles --version` and `handles.__version__`: the installed distribution's version, from its metadata."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

import handles
from handles.cli import main

HANDLES = Path(sys.executable).parent / "handles"


def test_version_attribute_is_the_installed_distributions_version() -> None:
    assert handles.__version__ == version("mcp-handles")


def test_handles_version_prints_the_version_and_exits_zero() -> None:
    done = subprocess.run([str(HANDLES), "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"handles {version('mcp-handles')}\n"


def test_version_needs_no_command_and_no_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"handles {handles.__version__}\n"


def test_a_checkout_that_is_not_installed_says_so_in_its_version(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> str:
        raise PackageNotFoundError(name)

    monkeypatch.delitem(vars(handles), "__version__", raising=False)
    monkeypatch.setattr("importlib.metadata.version", not_installed)
    assert handles.__version__ == "0+unknown"
    monkeypatch.delitem(vars(handles), "__version__")
