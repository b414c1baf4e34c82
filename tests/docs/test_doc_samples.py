"""Every Python sample in README.md and docs/ runs, so the docs cannot drift from the code.

The samples of one page run in order, as one program, in a fresh process and a scratch
directory (server-starting lines sit under `if __name__ == "__main__":` and are skipped).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def samples(page: Path) -> list[str]:
    return FENCE.findall(page.read_text())


PAGES_WITH_CODE = [page for page in PAGES if samples(page)]


def test_the_docs_have_samples() -> None:
    assert len(PAGES_WITH_CODE) >= 4


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=lambda p: p.name)
def test_page_samples_run(page: Path, tmp_path: Path) -> None:
    program = "\n\n".join(samples(page))
    script = tmp_path / f"{page.stem}_samples.py"
    script.write_text(program)
    env = dict(
        os.environ,
        HANDLES_DATA_DIR=str(tmp_path / "data"),
        HANDLES_SECRET_KEYS="docs-sample-key-" + "d" * 32,
        HANDLES_CONSOLE_TOKEN="docs-console-token-" + "c" * 16,  # as a deployment with the console sets it
        PYTHONPATH=str(ROOT),
    )
    env.pop("HANDLES_DATABASE_URL", None)
    ran = subprocess.run(
        [sys.executable, "-c", f"import runpy; runpy.run_path({str(script)!r}, run_name='docs_sample')"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, f"{page.name} samples failed:\n{ran.stderr[-4000:]}"
