"""A server that speaks only the 2025-11-25 experimental Tasks design: FastMCP 3 (`fastmcp[tasks]==3.4.11`,
on `mcp` 1.x) with `@mcp.tool(task=True)`, over Streamable HTTP. It has no handle tools and no Tasks extension.

Runs in tests/interop/.venv-fastmcp3, never in the project's environment:

    tests/interop/.venv-fastmcp3/bin/python tests/interop/fastmcp3_server.py PORT
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass

from fastmcp import Context, FastMCP

mcp = FastMCP("older-design-only")


@mcp.tool(task=True)
async def count_to(n: int, ctx: Context) -> dict[str, int]:
    """Count slowly, reporting progress."""
    for i in range(n):
        await asyncio.sleep(0.1)
        await ctx.report_progress(i + 1, n)
    return {"counted": n}


@mcp.tool(task=True)
async def sleep_for(seconds: float) -> str:
    """Sleep, then say so."""
    await asyncio.sleep(seconds)
    return "slept"


@mcp.tool(task=True)
async def refuse(reason: str) -> str:
    """Fail with `reason`."""
    raise ValueError(reason)


@dataclass
class Approval:
    approve: bool


@mcp.tool(task=True)
async def publish(page: str, ctx: Context) -> str:
    """Publish a page once someone approves it."""
    answer = await ctx.elicit(f"Publish {page}?", Approval)
    return "published" if answer.action == "accept" and answer.data.approve else "kept"


if __name__ == "__main__":
    mcp.run(transport="http", host="127.0.0.1", port=int(sys.argv[1]), show_banner=False)
