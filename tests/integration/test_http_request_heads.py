"""A long request head gets the same answer however its bytes arrive.

A 2026-07-28 client mirrors `params.taskId` (or a tool's name) into the `Mcp-Name` header, so a made-up
100,000-character task id is a 100 KB request head. uvicorn's HTTP parser (h11) refuses a head larger
than its buffer limit only while the head is incomplete: the same request was answered with a JSON-RPC
error when its bytes arrived at once and with a bare "Invalid HTTP request received." when they arrived
in two reads (as they do through a proxy, or on a loaded machine). `serve_http` reads heads up to
`REQUEST_HEAD_BYTES` whole, so the answer no longer depends on the network; so does the server
`handles.testing` serves in-process, configured by the same helper.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from http.client import HTTPResponse
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from example_server.server import build_server, create_jobs
from handles.server.serving import REQUEST_HEAD_BYTES
from handles.testing import served
from tests.reliability.support import RawReply, final_message
from tests.support import HttpExampleServer, handles_config
from tests.tasks.wire import PROTOCOL, meta

TASK_ID = "x" * 100_000


def _request(port: int) -> bytes:
    """`tasks/get` of a made-up task id as a 2026-07-28 client sends it: envelope in `_meta`, id mirrored
    into `Mcp-Name`."""
    params = {"taskId": TASK_ID, "_meta": meta(declare=True)}
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": params}).encode()
    head = (
        "POST /mcp HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{port}\r\n"
        "Content-Type: application/json\r\n"
        "Accept: application/json, text/event-stream\r\n"
        f"MCP-Protocol-Version: {PROTOCOL}\r\n"
        "Mcp-Method: tasks/get\r\n"
        f"Mcp-Name: {TASK_ID}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    return head + body


def _send(port: int, pieces: list[bytes]) -> RawReply:
    """Send `pieces` with a pause between them (so the server reads them apart) and read the reply."""
    began = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        for number, piece in enumerate(pieces):
            if number:
                time.sleep(0.3)
            sock.sendall(piece)
        response = HTTPResponse(sock)
        response.begin()
        raw = response.read().decode(errors="replace")
    body = final_message(raw, response.getheader("content-type", ""))
    return RawReply(response.status, body, raw, time.perf_counter() - began)


SPLITS = pytest.mark.parametrize(
    "split_at", [None, 20_000, 70_000], ids=["whole", "two-reads-20k", "two-reads-70k"]
)


def _assert_json_rpc_error(port: int, split_at: int | None) -> None:
    assert len(TASK_ID) < REQUEST_HEAD_BYTES
    request = _request(port)
    reply = _send(port, [request] if split_at is None else [request[:split_at], request[split_at:]])
    assert 400 <= reply.status < 500, (reply.status, reply.raw[:300])
    # The answer says what was wrong with the call, not that the HTTP bytes could not be parsed.
    assert reply.error["code"] in {-32600, -32602, -32020, -32021, -32022}, reply.error


@SPLITS
def test_a_long_mcp_name_header_gets_a_json_rpc_error_however_it_arrives(
    http_example: HttpExampleServer, split_at: int | None
) -> None:
    _assert_json_rpc_error(http_example.port, split_at)


@pytest.fixture(scope="module")
def in_process_port(tmp_path_factory: pytest.TempPathFactory, signing_key: str) -> Iterator[int]:
    """The example server served in this process by `handles.testing.served`."""
    jobs = create_jobs(handles_config(Path(tmp_path_factory.mktemp("in-process")), [signing_key]))
    with served(build_server(jobs), jobs) as url:
        port = urlsplit(url).port
        assert port is not None
        yield port


@SPLITS
def test_the_in_process_server_of_handles_testing_answers_a_long_head_as_serve_http_does(
    in_process_port: int, split_at: int | None
) -> None:
    _assert_json_rpc_error(in_process_port, split_at)
