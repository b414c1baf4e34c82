"""The `handles check` gates as pytest test cases, against a server by URL, by stdio command, or built in the
suite and served in-process (docs/checking.md)."""

from __future__ import annotations

import atexit
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from handles.check import GATES, GateResult, load_plan, run_gates

if TYPE_CHECKING:
    from handles.app import Handles

Principals = Sequence[tuple[str, str | None]]
"""The owner of the jobs, then the other principal: (name, bearer token or None)."""


STARTUP_SECONDS = 30.0
_serving = ExitStack()
atexit.register(_serving.close)
_served_urls: dict[int, str] = {}


@contextmanager
def served(server: Any, handles: Handles) -> Iterator[str]:
    """`server` (an `MCPServer` or FastMCP server) and its `handles` served over stateless Streamable HTTP on a
    free local port, in a thread of its own, while the block runs; yields the endpoint's URL."""
    import uvicorn

    from handles.server.serving import streamable_http_app, uvicorn_config

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    stop = threading.Event()
    uvicorn_servers: list[uvicorn.Server] = []

    async def serve() -> None:
        # Configured, and the store prepared, on the loop that serves, as `serve_http` does.
        config = await uvicorn_config(streamable_http_app(server, handles), handles)
        uvicorn_servers.append(uvicorn.Server(config))
        uvicorn_servers[0].should_exit = stop.is_set()  # the block may have ended while it prepared
        await uvicorn_servers[0].serve(sockets=[listening])

    thread = threading.Thread(target=anyio.run, args=(serve,), daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_SECONDS
    try:
        while not (uvicorn_servers and uvicorn_servers[0].started):
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start; its errors are in the log above")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{listening.getsockname()[1]}/mcp"
    finally:
        stop.set()
        for uvicorn_server in uvicorn_servers:
            uvicorn_server.should_exit = True
        thread.join()
        listening.close()


def gate_results(
    server: Any,
    principals: Principals,
    jobs: str | PathLike[str],
    only: Sequence[str] = (),
    *,
    handles: Handles | None = None,
) -> list[GateResult]:
    """Each gate's result (those in `only`, else all) against `server`, as `handles check` reports them.

    `server` is a URL or `StdioServerParameters`, or, with its `handles`, a server served in this process
    (`served`, once for the process: a `Handles` runtime starts once)."""
    if handles is not None:
        if id(handles) not in _served_urls:
            _served_urls[id(handles)] = _serving.enter_context(served(server, handles))
        server = _served_urls[id(handles)]
    selected = list(only or GATES)
    return anyio.run(run_gates, server, list(principals), load_plan(Path(jobs)), selected)


def assert_gates(
    server: Any,
    principals: Principals,
    jobs: str | PathLike[str],
    only: Sequence[str] = (),
    *,
    handles: Handles | None = None,
) -> None:
    """Raise `AssertionError` with the evidence of every gate that fails (arguments as `gate_results`)."""
    results = gate_results(server, principals, jobs, only, handles=handles)
    failed = [result for result in results if not result.passed]
    assert not failed, "\n\n".join(f"{result.name}:\n  " + "\n  ".join(result.evidence) for result in failed)


def gate_tests(
    server: Any,
    principals: Principals,
    jobs: str | PathLike[str],
    only: Sequence[str] = (),
    *,
    handles: Handles | None = None,
) -> Callable[[str], None]:
    """A pytest test function with one case per gate (arguments as `gate_results`); `server` may also be a
    function that returns a URL or `StdioServerParameters`."""
    import pytest  # only a test suite calls this

    @pytest.mark.parametrize("gate", list(only or GATES))
    def test_gate(gate: str) -> None:
        target = server() if callable(server) and handles is None else server
        assert_gates(target, principals, jobs, [gate], handles=handles)

    return test_gate
