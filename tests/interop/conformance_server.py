"""The example server with the tools the official conformance suite's Tasks scenarios call, over HTTP.

`python -m tests.interop.conformance_server --port N [--fastmcp]`: the example's jobs and tools, on the
SDK's `MCPServer` or on FastMCP 4, plus the fixtures `@modelcontextprotocol/conformance` requires by name
(its scenarios list them under "Required server fixtures"): `greet`, an ordinary tool, and six jobs, each
served by `handles` like the example's own.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from example_server.server import build_fastmcp_server, build_server, create_jobs
from handles import AskFirst, Handles, JobContext, JobFailed, serve_http


class Confirm(BaseModel):
    confirm: bool = Field(description="Go ahead?")


class Detail(BaseModel):
    """One of `multi_input`'s two questions (the suite answers each with a name and a confirmation)."""

    name: str = Field(default="", description="A name.")
    confirm: bool = Field(default=False, description="Go ahead?")


class UserName(BaseModel):
    name: str = Field(description="Your name.")


def greet(name: str) -> str:
    """Greet someone (an ordinary tool: never a task)."""
    return f"Hello, {name}!"


def declare_fixtures(jobs: Handles) -> None:
    """Declare the suite's task-supporting fixtures on `jobs`, before it is bound to a server."""

    @jobs.job
    async def slow_compute(ctx: JobContext, seconds: float, label: str = "") -> str:
        """Sleep `seconds`, then answer; cancellable while it sleeps."""
        await asyncio.sleep(seconds)
        return f"computed {label} after {seconds} s"

    @jobs.job(plain_call="tasks_only")
    async def failing_job(ctx: JobContext) -> str:
        """Report a tool error after a second (a task only: a caller without Tasks gets -32021)."""
        await asyncio.sleep(1)
        raise ToolError("failing_job always fails")

    @jobs.job
    async def protocol_error_job(ctx: JobContext) -> str:
        """Fail the job itself (a `failed` task with its error), not the tool."""
        raise JobFailed("protocol_error_job always fails")

    @jobs.job(asks_input=True)
    async def confirm_delete(ctx: JobContext, filename: str) -> str:
        """Ask once before deleting a (pretend) file."""
        answer = await ctx.ask(f"Delete {filename}?", Confirm)
        return f"deleted {filename}" if answer.confirm else f"kept {filename}"

    @jobs.job(asks_input=True)
    async def multi_input(ctx: JobContext) -> str:
        """Ask two questions at once."""
        first, second = await asyncio.gather(
            ctx.ask("First detail?", Detail), ctx.ask("Second detail?", Detail)
        )
        return f"got {first.name} and {second.name}"

    @jobs.job(plain_call="tasks_only", ask_first=AskFirst("What is your name?", UserName))
    async def test_tool_with_task(ctx: JobContext) -> str:
        """Ask a name before anything starts, then greet it from a task."""
        return f"Hello, {ctx.first_answer.name}!"


def build(framework: str) -> tuple[Any, Handles]:
    jobs = create_jobs()
    declare_fixtures(jobs)
    if framework == "fastmcp":
        server = build_fastmcp_server(jobs)
        server.tool(greet)
    else:
        server = build_server(jobs)
        server.add_tool(greet)
    return server, jobs


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.interop.conformance_server", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--fastmcp", action="store_true", help="serve from FastMCP 4 instead of MCPServer")
    args = parser.parse_args()
    server, jobs = build("fastmcp" if args.fastmcp else "mcpserver")
    asyncio.run(serve_http(server, jobs, host="127.0.0.1", port=args.port))


if __name__ == "__main__":
    main()
