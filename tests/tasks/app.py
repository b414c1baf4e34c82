"""The Tasks test server: small jobs that reach every task status quickly, and one ordinary tool.

- `quick(text)`: ends at once with a structured result.
- `slow(seconds)`: reports progress ten times over `seconds`, stops at its next step when cancelled.
- `ask_two(topic)`: asks two questions at the same time (keys q1 and q2), returns both answers.
- `tool_error()`: ends `completed` with a tool error (`isError: true`).
- `failing()`: ends `failed` (a JSON-RPC error).
- `brief()`: ends at once; kept for three seconds only (for expired task ids; long enough to see it end
  on a loaded machine).
- `only_task()`: served to declaring callers only (`plain_call="tasks_only"`).
- `greet(name)`: an ordinary tool, not a job.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from handles import Handles, HandlesConfig, JobContext, JobFailed

POLL = timedelta(milliseconds=200)
INLINE_BUDGET_SECONDS = 3.0


class Echo(BaseModel):
    text: str
    length: int


class Done(BaseModel):
    steps: int


class Choice(BaseModel):
    color: str = Field(description="Your favourite colour.")


class Confirm(BaseModel):
    confirm: bool = Field(description="Go ahead?")


class Answers(BaseModel):
    color: str
    confirm: bool


async def quick(ctx: JobContext, text: str) -> Echo:
    """Echo a text back."""
    return Echo(text=text, length=len(text))


async def slow(ctx: JobContext, seconds: float = 1.0) -> Done:
    """Work for `seconds`, reporting progress ten times."""
    for step in range(10):
        await ctx.checkpoint()
        await asyncio.sleep(seconds / 10)
        await ctx.progress(step + 1, 10, f"Step {step + 1} of 10")
    return Done(steps=10)


async def ask_two(ctx: JobContext, topic: str) -> Answers:
    """Ask two questions at once, then answer with both."""
    choice, confirm = await asyncio.gather(
        ctx.ask(f"Which colour for {topic}?", Choice), ctx.ask(f"Go ahead with {topic}?", Confirm)
    )
    return Answers(color=choice.color, confirm=confirm.confirm)


async def tool_error(ctx: JobContext) -> Done:
    """End with a tool error."""
    raise ToolError("The input was refused: nothing to do.")


async def failing(ctx: JobContext) -> Done:
    """End failed."""
    raise JobFailed("The upstream service refused the request.")


async def brief(ctx: JobContext) -> Done:
    """End at once; kept one second."""
    return Done(steps=0)


async def only_task(ctx: JobContext) -> Done:
    """Runs only as a task."""
    await asyncio.sleep(0.2)
    return Done(steps=1)


def greet(name: str) -> str:
    """Say hello (an ordinary tool)."""
    return f"Hello, {name}!"


def tasks_config(data_dir: Path, key: str, **overrides: Any) -> HandlesConfig:
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "secret_keys": (key,),
        "store_poll_seconds": 0.05,
        "sweep_interval_seconds": 0.2,
        "inline_budget_seconds": INLINE_BUDGET_SECONDS,
        "drain_seconds": 1.0,
        **overrides,
    }
    return HandlesConfig(**values)


BRIEF_RETENTION_SECONDS = 3


def create_test_jobs(config: HandlesConfig) -> Handles:
    jobs = Handles(config)
    jobs.job(poll_after=POLL)(quick)
    jobs.job(poll_after=POLL)(slow)
    jobs.job(poll_after=POLL, asks_input=True)(ask_two)
    jobs.job(poll_after=POLL)(tool_error)
    jobs.job(poll_after=POLL)(failing)
    jobs.job(poll_after=POLL, retention=timedelta(seconds=BRIEF_RETENTION_SECONDS))(brief)
    jobs.job(poll_after=POLL, plain_call="tasks_only")(only_task)
    return jobs


def build_test_server(jobs: Handles, **options: Any) -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer("handles-tasks-test", extensions=[jobs.tasks_extension()], **options)
    server.add_tool(greet)
    jobs.bind(server)
    return server
