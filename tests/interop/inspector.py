"""The MCP Inspector (`@modelcontextprotocol/inspector`, the npm package) as a client of the example server.

Installed once into tests/interop/.inspector with the machine's Node.js and npm (`npm install` of the pinned
version), then reused; test workers that prepare it at once take turns on a lock file beside it. Two of its
command-line clients drive a server:

- `mcp-inspector --cli URL --method ...`: one process, one connection and one request (after the
  handshake) per command, so each command is a client that has never seen the server before.
- `mcpdo`: a daemon holds named connections; each `mcpdo` command runs one operation on one of them. In
  the 2026-07-28 era (`connect --era modern`) it declares the Tasks extension, takes a task when the server
  gives one, polls `tasks/get` to the end, and surfaces a task's questions as `elicitationPending`
  (answered with `elicitation/respond`, which it sends as `tasks/update`).

Every command runs with a home and a daemon of its own (`mcpdo private`) and secrets kept in memory, so
nothing is read from or written to the user's `~/.mcp-inspector`.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

INSPECTOR_VERSION = "2.12.0"
"""The Inspector these tests run (2.12.0: November 2026; its clients speak both protocol eras and Tasks)."""
INSPECTOR_DIR = Path(__file__).with_name(".inspector")
BIN = INSPECTOR_DIR / "node_modules" / ".bin"


def ensure_inspector(timeout: float = 300) -> Path:
    """The directory of the Inspector's executables, installed when missing (`ensure_npm_packages`)."""
    ensure_npm_packages(INSPECTOR_DIR, {"@modelcontextprotocol/inspector": INSPECTOR_VERSION}, timeout)
    return BIN


def ensure_npm_packages(directory: Path, packages: dict[str, str], timeout: float = 300) -> None:
    """`packages` ({name: version}) installed with npm into `directory` when missing; test workers that prepare
    it at once take turns on a lock file beside it. Without Node.js and npm, or when the install fails, the test
    fails under CI and is skipped elsewhere."""
    problem = _prepare(directory, packages, timeout)
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{', '.join(packages)}: {problem}")
        pytest.skip(f"{', '.join(packages)}: {problem}")


def _installed(directory: Path, packages: dict[str, str]) -> bool:
    for package, version in packages.items():
        manifest = directory / "node_modules" / package / "package.json"
        if not manifest.exists() or json.loads(manifest.read_text()).get("version") != version:
            return False
    return True


def _prepare(directory: Path, packages: dict[str, str], timeout: float) -> str | None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        return "Node.js and npm are needed (Debian: apt-get install nodejs npm)"
    directory.mkdir(parents=True, exist_ok=True)
    specs = [f"{package}@{version}" for package, version in packages.items()]
    with open(directory.with_name(f"{directory.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _installed(directory, packages):
            return None
        done = subprocess.run(
            ["npm", "install", "--prefix", str(directory), "--no-audit", "--no-fund", "--no-save", *specs],
            capture_output=True,
            text=True,
            timeout=timeout,
        )  # fmt: skip
        if done.returncode != 0 or not _installed(directory, packages):
            return f"npm install of {' '.join(specs)} failed:\n{done.stderr[-2000:]}"
    return None


def _json_documents(text: str) -> list[Any]:
    """Every JSON document in `text` that starts a line, in order (a command may print more than one, and
    lines of text around them: the Inspector's notices)."""
    decoder, documents, at = json.JSONDecoder(), [], 0
    while at < len(text):
        if text[at] in "{[" and (at == 0 or text[at - 1] == "\n"):
            try:
                document, at = decoder.raw_decode(text, at)
            except json.JSONDecodeError:
                pass
            else:
                documents.append(document)
                continue
        newline = text.find("\n", at)
        at = len(text) if newline < 0 else newline + 1
    return documents


class Inspector:
    """The Inspector's command-line clients, each command a process of its own, run in `home`."""

    def __init__(self, home: Path) -> None:
        self.bin = ensure_inspector()
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "MCP_INSPECTOR_SECRET_STORE": "memory",
            "NO_COLOR": "1",
        }
        self._daemon = False

    def _run(self, program: str, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin / program), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            cwd=self.home,
        )

    def cli_process(
        self,
        target: str | list[str],
        *args: str,
        headers: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """`mcp-inspector --cli TARGET ARGS --format json`, run to its end: its exit code and what it printed.
        `target` is a server's URL, or the command of a stdio server (which the Inspector starts with `env`
        and ends as it exits)."""
        command = [target] if isinstance(target, str) else target
        options = [part for name, value in (env or {}).items() for part in ("-e", f"{name}={value}")]
        extra = [part for name, value in (headers or {}).items() for part in ("--header", f"{name}: {value}")]
        return self._run(
            "mcp-inspector", ["--cli", *options, *command, *args, *extra, "--format", "json"], timeout
        )

    def cli(
        self,
        target: str | list[str],
        *args: str,
        headers: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 60,
    ) -> Any:
        """`mcp-inspector --cli TARGET ARGS --format json -q`: the result it prints (a JSON-RPC error is
        returned as `{"error": ...}`, as the Inspector prints it)."""
        done = self.cli_process(target, *args, "-q", headers=headers, env=env, timeout=timeout)
        documents = _json_documents(done.stdout) or _json_documents(done.stderr)
        assert documents, f"the Inspector printed nothing (exit {done.returncode}):\n{done.stderr[-2000:]}"
        return documents[-1]

    def mcpdo(self, *args: str, timeout: float = 60) -> Any:
        """`mcpdo --format json ARGS` on this Inspector's own daemon (started by the first command)."""
        if not self._daemon:
            exports = self._run("mcpdo", ["private"], timeout)
            assert exports.returncode == 0, exports.stderr
            for line in exports.stdout.splitlines():  # export NAME='value'
                name, _, value = line.removeprefix("export ").partition("=")
                self.env[name] = value.strip("'")
            self._daemon = True
        done = self._run("mcpdo", ["--format", "json", *args], timeout)
        documents = _json_documents(done.stdout) or _json_documents(done.stderr)
        assert documents, f"mcpdo printed nothing (exit {done.returncode}):\n{done.stderr[-2000:]}"
        return documents[-1]

    def close(self) -> None:
        """Stop this Inspector's daemon, if it started one (its connections with it)."""
        if self._daemon:
            self._run("mcpdo", ["daemon", "stop"], 30)
            self._daemon = False
