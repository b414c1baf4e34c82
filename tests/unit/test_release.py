"""What a release ships beside the code: its licence, a changelog entry for its version, the typing marker."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_licence_file_is_the_mit_licence_the_metadata_names() -> None:
    assert PROJECT["license"] == "MIT"
    assert "LICENSE" in PROJECT["license-files"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License")
    assert "the handles authors" in text


def test_the_changelog_has_an_unreleased_section_and_an_entry_for_this_version() -> None:
    headings = re.findall(r"^## \[([^\]]+)\]", (ROOT / "CHANGELOG.md").read_text(), flags=re.MULTILINE)
    assert headings[:2] == ["Unreleased", PROJECT["version"]], headings


def test_the_package_is_marked_as_typed_and_the_marker_is_package_data() -> None:
    assert (ROOT / "handles" / "py.typed").is_file()
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "py.typed" in setuptools["package-data"]["handles"]
    assert setuptools["packages"]["find"]["include"] == ["handles*"], "example_server stays out of the wheel"
