"""Raw JSON-RPC over Streamable HTTP (2026-07-28), to see the exact wire, and servers to send it to.

`Wire.call` builds one POST the way the spec describes it: the `_meta` envelope
(protocol version, client capabilities, optionally the Tasks extension), the
`MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` headers, and a bearer token.
The reply keeps the HTTP status, the headers, every SSE notification, and the
JSON-RPC `result` or `error`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import uvicorn
from starlette.types import ASGIApp

from tests.support import FRAMEWORKS, HttpExampleServer, new_key

PROTOCOL = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
_ids = itertools.count(1)


def meta(*, declare: bool, capabilities: dict[str, Any] | None = None) -> dict[str, Any]:
    caps: dict[str, Any] = dict(capabilities or {})
    if declare:
        caps["extensions"] = {**caps.get("extensions", {}), TASKS: {}}
    return {
        "io.modelcontextprotocol/protocolVersion": PROTOCOL,
        "io.modelcontextprotocol/clientCapabilities": caps,
        "io.modelcontextprotocol/clientInfo": {"name": "raw-wire-test", "version": "0"},
    }


@dataclass
class Reply:
    status: int
    headers: httpx2.Headers
    body: dict[str, Any]
    notifications: list[dict[str, Any]] = field(default_factory=list)

    @property
    def result(self) -> dict[str, Any]:
        assert "result" in self.body, f"expected a result, got {self.body}"
        result: dict[str, Any] = self.body["result"]
        return result

    @property
    def error(self) -> dict[str, Any]:
        assert "error" in self.body, f"expected an error, got {self.body}"
        error: dict[str, Any] = self.body["error"]
        return error


def parse_sse(text: str) -> list[dict[str, Any]]:
    messages = []
    for event in text.replace("\r\n", "\n").split("\n\n"):
        data = "\n".join(line[5:].lstrip() for line in event.split("\n") if line.startswith("data:"))
        if data:
            messages.append(json.loads(data))
    return messages


@dataclass
class Wire:
    """Sends hand-built 2026-07-28 requests to one Streamable HTTP endpoint."""

    url: str
    http: httpx2.AsyncClient

    async def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        token: str | None = None,
        declare: bool = True,
        capabilities: dict[str, Any] | None = None,
        headers: dict[str, str | None] | None = None,
    ) -> Reply:
        body_params = dict(params or {})
        body_params.setdefault("_meta", {})
        body_params["_meta"] = {**meta(declare=declare, capabilities=capabilities), **body_params["_meta"]}
        sent: dict[str, str] = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": PROTOCOL,
            "Mcp-Method": method,
        }
        name = body_params.get("taskId") if method.startswith("tasks/") else body_params.get("name")
        if isinstance(name, str):
            sent["Mcp-Name"] = name
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        for key, value in (headers or {}).items():
            sent.pop(key, None)
            if value is not None:
                sent[key] = value
        request = {"jsonrpc": "2.0", "id": next(_ids), "method": method, "params": body_params}
        response = await self.http.post(self.url, json=request, headers=sent)
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            messages = parse_sse(response.text)
            final = [m for m in messages if "id" in m and ("result" in m or "error" in m)]
            notes = [m for m in messages if "id" not in m]
            return Reply(response.status_code, response.headers, final[-1], notes)
        return Reply(response.status_code, response.headers, response.json())

    async def listen(
        self,
        notifications: dict[str, Any],
        *,
        token: str | None = None,
        declare: bool = True,
        until: Callable[[dict[str, Any]], bool] = lambda frame: False,
        seconds: float = 20.0,
        on_ack: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
    ) -> Reply:
        """`subscriptions/listen` read as a stream: every frame until one satisfies `until`, the response
        (the stream's end, or an error) arrives, or `seconds` pass; the body is the response or {}.
        `on_ack` runs once the acknowledgement has arrived (to change a task while listening)."""
        request_id = f"listen-{next(_ids)}"
        params = {"_meta": meta(declare=declare), "notifications": notifications}
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": PROTOCOL,
            "Mcp-Method": "subscriptions/listen",
        }
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        request = {"jsonrpc": "2.0", "id": request_id, "method": "subscriptions/listen", "params": params}
        frames: list[dict[str, Any]] = []
        body: dict[str, Any] = {}
        async with self.http.stream("POST", self.url, json=request, headers=headers) as response:
            if not response.headers.get("content-type", "").startswith("text/event-stream"):
                return Reply(response.status_code, response.headers, json.loads(await response.aread()))

            async def read() -> None:
                nonlocal body
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    frame = json.loads(line[5:])
                    if "id" in frame:
                        body = frame
                        return
                    frames.append(frame)
                    if (
                        frame.get("method") == "notifications/subscriptions/acknowledged"
                        and on_ack is not None
                    ):
                        await on_ack(frame)
                    if until(frame):
                        return

            with anyio.move_on_after(seconds):
                await read()
            return Reply(response.status_code, response.headers, body, frames)

    async def tool(self, name: str, arguments: dict[str, Any] | None = None, **options: Any) -> Reply:
        return await self.call("tools/call", {"name": name, "arguments": arguments or {}}, **options)

    async def get(self, task_id: str, **options: Any) -> Reply:
        return await self.call("tasks/get", {"taskId": task_id}, **options)

    async def until(
        self, task_id: str, statuses: set[str], *, timeout: float = 15.0, **options: Any
    ) -> dict[str, Any]:
        """Poll tasks/get until the task's status is one of `statuses`; returns that `tasks/get` result."""
        deadline = time.monotonic() + timeout
        while True:
            result = (await self.get(task_id, **options)).result
            if result["status"] in statuses:
                return result
            assert time.monotonic() < deadline, f"task still {result['status']} after {timeout} s"
            await asyncio.sleep(0.05)


def older_headers(token: str | None) -> dict[str, str]:
    """The headers of a request of a 2025-11-25 (handshake-era) client after `initialize`."""
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
    return headers | ({"Authorization": f"Bearer {token}"} if token else {})


async def older_result_frames(
    http: httpx2.AsyncClient, url: str, task_id: str, token: str | None = None
) -> AsyncIterator[dict[str, Any]]:
    """Each frame of a 2025-11-25 `tasks/result` stream as it arrives: notifications, the server's
    requests (its questions), then the response."""
    request = {
        "jsonrpc": "2.0",
        "id": f"result-{next(_ids)}",
        "method": "tasks/result",
        "params": {"taskId": task_id},
    }
    async with http.stream("POST", url, json=request, headers=older_headers(token)) as response:
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                yield json.loads(line[5:])


async def post_answer(
    http: httpx2.AsyncClient, url: str, question_id: str, result: Any, token: str | None = None
) -> int:
    """POST a JSON-RPC response to a question the server asked, as a client's elicitation handler does;
    the HTTP status."""
    answer = {"jsonrpc": "2.0", "id": question_id, "result": result}
    return (await http.post(url, json=answer, headers=older_headers(token))).status_code


class ThreadedServer:
    """An ASGI app served by uvicorn on a thread of its own (its own event loop), on a free port."""

    def __init__(self, app: ASGIApp, port: int) -> None:
        self.port = port
        self._server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        )
        self._thread = threading.Thread(target=self._server.run, name="tasks-test-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> ThreadedServer:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            assert self._thread.is_alive(), "the test server thread died while starting"
            assert time.monotonic() < deadline, "the test server did not start"
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=20)


@contextmanager
def example_process(
    data_dir: Path, tokens: dict[str, str], framework: str = "mcpserver"
) -> Iterator[HttpExampleServer]:
    """The example server on an SQLite file of its own, with a fresh key, 1 s jobs and a store polled
    every 50 ms; stopped afterwards."""
    settings = {"HANDLES_STORE_POLL_SECONDS": "0.05", "EXAMPLE_JOB_SECONDS": "1"}
    with HttpExampleServer(
        data_dir, [new_key()], tokens, env=settings, framework=framework
    ).running() as server:
        yield server


def example_on_each_framework(label: str, tokens: dict[str, str]) -> Any:
    """A module-scoped fixture: `example_process` with `tokens`, on each framework in turn (the SDK's
    `MCPServer`, then FastMCP 4 with `--fastmcp`), its data in a fresh directory named after `label`."""

    @pytest.fixture(scope="module", params=FRAMEWORKS)
    def example(
        tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
    ) -> Iterator[HttpExampleServer]:
        with example_process(tmp_path_factory.mktemp(label), tokens, request.param) as process:
            yield process

    return example
