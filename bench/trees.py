"""Another commit's tree from this checkout's history, for sections that run two codes side by side."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

from bench.common import REPO_ROOT


def tree_at(commit: str, into: Path) -> str | None:
    """`commit`'s tree written into `into`; None when done, otherwise why it could not be."""
    try:
        archive = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "archive", "--format=tar", commit], capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        stderr = getattr(exc, "stderr", b"") or b""
        return f"git archive {commit[:7]} failed ({stderr.decode(errors='replace').strip() or exc})"
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return None
