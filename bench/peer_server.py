"""The peer: FastMCP 4 with fastmcp-tasks (Docket on memory://), serving the benchmark's job shape.

Runs inside bench/.peer-venv (created by bench/peer.py), never in the project's environment:

    bench/.peer-venv/bin/python bench/peer_server.py --port 8124 [--tokens FILE]

- `noop()`: an ordinary tool (the baseline).
- `work(seconds=0.0, mark="")`: sleeps `seconds` and returns `{"slept": seconds, "mark": mark}`;
  `task=TaskConfig(mode="optional", poll_interval=100 ms)`: a call that declares the Tasks
  extension becomes a task, any other call runs inline (the same policy, and the same
  `pollIntervalMs` hint, as the `handles` benchmark server).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from datetime import timedelta
from pathlib import Path

import uvicorn
from fastmcp import FastMCP
from fastmcp.server.auth import AccessToken, TokenVerifier
from fastmcp.utilities.tasks import TaskConfig
from fastmcp_tasks import TasksExtension
from pydantic import BaseModel


class WorkResult(BaseModel):
    slept: float
    mark: str


class NoopResult(BaseModel):
    ok: bool


class FileTokens(TokenVerifier):
    """Bearer tokens from a JSON file {token: principal} (`--tokens`), verified by FastMCP's authentication."""

    def __init__(self, tokens: dict[str, str], base_url: str) -> None:
        super().__init__(base_url=base_url)
        self._tokens = tokens

    async def verify_token(self, token: str) -> AccessToken | None:
        principal = self._tokens.get(token)
        if principal is None:
            return None
        return AccessToken(token=token, client_id=principal, subject=principal, scopes=[])


def build(concurrency: int, auth: TokenVerifier | None = None) -> FastMCP:
    mcp = FastMCP("fastmcp-tasks-peer", auth=auth)
    mcp.add_extension(TasksExtension(url="memory://", concurrency=concurrency))

    @mcp.tool
    def noop() -> NoopResult:
        """Do nothing (the baseline)."""
        return NoopResult(ok=True)

    @mcp.tool(task=TaskConfig(mode="optional", poll_interval=timedelta(milliseconds=100)))
    async def work(seconds: float = 0.0, mark: str = "") -> WorkResult:
        """Sleep `seconds` and return."""
        if seconds > 0:
            await asyncio.sleep(seconds)
        return WorkResult(slept=seconds, mark=mark)

    return mcp


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8124)
    parser.add_argument("--tokens", type=Path, help="JSON file {token: principal}; requires bearer tokens")
    parser.add_argument("--concurrency", type=int, default=10, help="Docket worker concurrency (default 10)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    auth = None
    if args.tokens:
        auth = FileTokens(json.loads(args.tokens.read_text()), f"http://127.0.0.1:{args.port}")
    app = build(args.concurrency, auth).http_app(stateless_http=True)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
