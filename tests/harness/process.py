"""One harness for every server process the tests and benchmarks start.

`ServerProcess` runs a command (the example server, the reliability app, `bench.app`, the FastMCP peer,
a `handles worker`) with its output in a log file, waits until it listens on its port, and stops it:
SIGTERM with a grace period (`stop`), SIGKILL (`kill`), or both around a fresh start (`restart`).
`python_module` builds the command line of a `python -m` server.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, Self

REPO_ROOT = Path(__file__).resolve().parents[2]

Readiness = Literal["tcp", "http"]
"""When a started server counts as up: it accepts a TCP connection (`tcp`), or it answers an HTTP
request (`http`: a GET of a path no server serves, answered 404)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def server_env(data_dir: Path, **settings: str) -> dict[str, str]:
    """A server process's whole environment: this one's PATH and HOME, unbuffered output, this repository
    importable, its data in `data_dir`, then `settings` (`HANDLES_*`, `EXAMPLE_*`)."""
    return {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", str(data_dir)),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(REPO_ROOT),
        "HANDLES_DATA_DIR": str(data_dir),
        **settings,
    }


def python_module(module: str, *args: str) -> list[str]:
    """`python -m <module> <args>` with this interpreter."""
    return [sys.executable, "-m", module, *args]


class ServerProcess:
    """A subprocess on 127.0.0.1 (stdout and stderr in `log_path`), up once it listens on `port`.

    `port=None` is a process that serves nothing (a worker): `start` returns as soon as it runs, or, with
    `ready_line`, once what it writes from this start on contains that text (a worker's "running jobs").
    `append_log` keeps what earlier runs wrote (a restarted server's log reads as one story).
    """

    def __init__(
        self,
        args: list[str],
        env: dict[str, str],
        log_path: Path,
        port: int | None = None,
        *,
        name: str = "the server",
        ready: Readiness = "tcp",
        ready_line: str | None = None,
        start_timeout: float = 30.0,
        stop_timeout: float = 15.0,
        append_log: bool = False,
        cwd: Path = REPO_ROOT,
    ) -> None:
        self.args, self.env, self.log_path, self.port, self.name = args, env, log_path, port, name
        self.ready, self.start_timeout, self.stop_timeout = ready, start_timeout, stop_timeout
        self.ready_line = ready_line
        self.append_log, self.cwd = append_log, cwd
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float | None = None) -> Self:
        """Start the process and return once it is up; a process that exits or never listens is an error."""
        assert not self.alive, f"{self.name} is already running"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        earlier = len(self.log()) if self.append_log else 0  # an earlier run's lines do not count
        with self.log_path.open("ab" if self.append_log else "wb") as log:
            self.process = subprocess.Popen(
                self.args,
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        if self.port is None and self.ready_line is None:
            return self
        seconds = self.start_timeout if timeout is None else timeout
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited early:\n{self.log()[-4000:]}")
            if self._answers(earlier):
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer within {seconds} s:\n{self.log()[-4000:]}")

    def _answers(self, earlier: int) -> bool:
        if self.port is None:
            return self.ready_line is not None and self.ready_line in self.log()[earlier:]
        if self.ready == "tcp":
            try:
                with socket.create_connection(("127.0.0.1", self.port or 0), timeout=0.2):
                    return True
            except OSError:
                return False
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health-probe", timeout=0.5)
        except OSError as exc:
            return getattr(exc, "code", None) == 404
        return True

    def stop(self) -> None:
        """SIGTERM, and SIGKILL when the process has not exited within `stop_timeout` seconds."""
        if not self.alive:
            return
        assert self.process is not None
        self.process.terminate()
        try:
            self.process.wait(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL (as by kill -9): no clean-up, no settling of running jobs."""
        if self.alive:
            assert self.process is not None
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def restart(self) -> Self:
        self.stop()
        return self.start()

    @contextlib.contextmanager
    def running(self) -> Iterator[Self]:
        """Started for the `with` block, stopped after it."""
        self.start()
        try:
            yield self
        finally:
            self.stop()

    def log(self) -> str:
        """Everything the process wrote (its stdout and stderr)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    # -- what the process uses, from /proc --

    def status_kib(self, field_name: str = "VmRSS") -> int | None:
        """A `VmRSS` / `VmHWM` figure (KiB) of the process, or None once it is gone."""
        return status_kib(self.pid, field_name)

    def rss_kib(self) -> int:
        rss = self.status_kib("VmRSS")
        if rss is None:
            raise RuntimeError("no VmRSS")
        return rss

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))


def status_kib(pid: int, field_name: str) -> int | None:
    """A `VmRSS` / `VmHWM` figure (KiB) of a process, from /proc."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks
    except (OSError, IndexError, ValueError):
        return None
