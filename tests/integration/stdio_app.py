"""A stdio server for tests/integration/test_stdio_stdout.py: `python -m tests.integration.stdio_app`.

- `hog(seconds)`: a job whose first step holds the GIL for `seconds`, in a C call that never releases it
  (as a CPU-bound job's step does, in a regular expression or an extension), then ends.
- `stray()`: a plain tool that writes to stdout while the server serves (`print`, and straight to fd 1).

Configured by `HANDLES_*`. Once serving ends (stdin closed), the process writes `AFTER_SERVING` to fd 1.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys

from mcp.server.mcpserver import MCPServer

from handles import Handles, JobContext, serve_stdio

STRAY_PRINT = "stdio-app: a stray print"
STRAY_WRITE = "stdio-app: a stray write to fd 1"
AFTER_SERVING = "stdio-app: after serving"


async def hog(ctx: JobContext, seconds: float) -> dict[str, float]:
    """Hold the GIL for `seconds`, then end."""
    # `PyDLL` calls keep the GIL (a `CDLL` call releases it): no other thread runs Python meanwhile.
    ctypes.PyDLL(None).usleep(int(seconds * 1_000_000))
    return {"held": seconds}


def stray() -> str:
    """Write to stdout twice (neither may reach the wire), then answer."""
    print(STRAY_PRINT, flush=True)
    os.write(1, (STRAY_WRITE + "\n").encode())
    return "quiet"


def main() -> None:
    jobs = Handles()
    jobs.job()(hog)
    server: MCPServer = MCPServer("stdio-app")
    server.add_tool(stray)
    jobs.bind(server)
    asyncio.run(serve_stdio(server, jobs))
    os.write(1, (AFTER_SERVING + "\n").encode())
    sys.exit(0)


if __name__ == "__main__":
    main()
