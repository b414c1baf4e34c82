"""The example server's jobs and tools.

- `generate_report(account, months)`: reports progress month by month.
- `deploy_release(version)`: asks mid-way for an approval and a target environment.
- `export_dataset(rows)`: long, cancellable mid-way; its CSV comes back as a link to read in parts.
- `lookup_account(account)`: an ordinary quick tool, for contrast.

`EXAMPLE_JOB_SECONDS` sets the nominal length of each long job (default 20).
`EXAMPLE_EFFECTS_FILE`, when set, gets one line per external effect of
`deploy_release` (what its durable steps guard), so tests can count them.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from datetime import timedelta
from importlib.metadata import version
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from handles import Handles, HandlesConfig, JobContext, ResultFile
from handles.jobs import JobOptions
from handles.tool_layout import ToolLayout, ToolNames


def job_seconds() -> float:
    """The nominal length of each long job, from EXAMPLE_JOB_SECONDS (default 20)."""
    return float(os.environ.get("EXAMPLE_JOB_SECONDS", "20"))


class Report(BaseModel):
    account: str
    months: int
    revenue_by_month: list[float]
    total_revenue: float


class Approval(BaseModel):
    """What deploy_release needs to know before it touches an environment."""

    approve: bool = Field(description="Approve this deployment?")
    environment: Literal["staging", "production"] = Field(description="Where to deploy.")


class Deployment(BaseModel):
    version: str
    environment: str
    steps: list[str]


def _record_effect(effect: str) -> str:
    """Stand-in for a real side effect (an upload, a traffic switch): appends a line to EXAMPLE_EFFECTS_FILE."""
    path = os.environ.get("EXAMPLE_EFFECTS_FILE")
    if path:
        with open(path, "a") as effects:
            effects.write(effect + "\n")
    return effect


def _revenue(account: str, month: int) -> float:
    return round(1000 + (sum(map(ord, account)) * (month + 1)) % 997 * 1.5, 2)


async def generate_report(
    ctx: JobContext, account: str, months: Annotated[int, Field(ge=1, le=120)] = 12
) -> Report:
    """Build the revenue report of an account, month by month."""
    pause = job_seconds() / months
    revenue: list[float] = []
    for month in range(months):
        await asyncio.sleep(pause)
        revenue.append(_revenue(account, month))
        await ctx.progress(month + 1, months, f"Processed month {month + 1} of {months}")
    return Report(
        account=account, months=months, revenue_by_month=revenue, total_revenue=round(sum(revenue), 2)
    )


async def deploy_release(ctx: JobContext, version: str) -> Deployment:
    """Build and deploy a release; asks for an approval and a target environment before deploying.

    While it waits for the answer the job holds no worker and no lease; the answer resumes it
    on whichever server node takes it.
    """
    steps = ["build", "test", "package"]
    pause = job_seconds() / 2 / len(steps)
    for done, step in enumerate(steps, start=1):
        # Steps too: once the question is answered the job is replayed from the top (possibly on
        # another node), and recorded steps are not run again. They have no effect outside the job, so
        # they are safe to repeat: one cut short by a crash runs again in the retry.
        await ctx.step(step, asyncio.sleep, pause, repeatable=True)
        await ctx.progress(done, len(steps) * 2, f"{step} finished")
    approval = await ctx.ask(f"Release {version} is built and tested. Deploy it, and where?", Approval)
    if not approval.approve:
        raise ToolError(f"Deployment of {version} was not approved; nothing was deployed.")
    rollout = ["upload", "migrate", "switch traffic"]
    for done, step in enumerate(rollout, start=len(steps) + 1):
        await asyncio.sleep(pause)
        # A durable step: recorded once done, never repeated when the job is retried after a crash.
        await ctx.step(step, _record_effect, f"{step} {version} to {approval.environment}")
        await ctx.progress(done, len(steps) * 2, f"{step} on {approval.environment}")
    return Deployment(version=version, environment=approval.environment, steps=steps + rollout)


async def export_dataset(ctx: JobContext, rows: Annotated[int, Field(ge=1, le=10_000_000)]) -> ResultFile:
    """Export a dataset as CSV, in chunks; stops cleanly at the next chunk when cancelled.

    The CSV comes back as a link to read with resources/read (in parts when large), never inline."""
    chunks = 20
    pause = job_seconds() / chunks
    for chunk in range(chunks):
        await ctx.checkpoint()
        await asyncio.sleep(pause)
        await ctx.progress((chunk + 1) * rows // chunks, rows, f"Exported chunk {chunk + 1} of {chunks}")
    return ResultFile(
        csv_rows(rows),
        media_type="text/csv",
        name=f"export-{ctx.job_id}.csv",
        summary=f"{rows} rows of id,account,amount,day with a header line.",
    )


def csv_rows(rows: int, block: int = 10_000) -> Iterator[str]:
    """The exported CSV, a block of rows at a time (never the whole file in memory)."""
    yield "id,account,amount,day\n"
    for start in range(0, rows, block):
        yield "".join(
            f"{i},acct-{i % 997:04d},{(i * 7919) % 100_000 / 100:.2f},2026-11-{i % 28 + 1:02d}\n"
            for i in range(start, min(start + block, rows))
        )


def lookup_account(account: str) -> dict[str, Any]:
    """Look up an account's plan and region (a quick, ordinary tool)."""
    return {"account": account, "plan": "enterprise" if len(account) > 4 else "team", "region": "eu-west"}


EXAMPLE_JOBS: list[tuple[Callable[..., Any], JobOptions]] = [
    # A report is pure: safe to run again after a crash.
    (
        generate_report,
        {"retention": timedelta(hours=6), "poll_after": timedelta(seconds=2), "on_interrupt": "retry"},
    ),
    # A deployment has effects, each guarded by a durable step, so a retry resumes instead of repeating them.
    (
        deploy_release,
        {
            "retention": timedelta(hours=6),
            "poll_after": timedelta(seconds=2),
            "asks_input": True,
            "input_timeout": timedelta(hours=1),
            "on_interrupt": "retry",
        },
    ),
    # An export left half-done is not resumable here: on a crash it fails and says so.
    (
        export_dataset,
        {
            "retention": timedelta(hours=1),
            "keep_result_for": timedelta(minutes=30),
            "poll_after": timedelta(seconds=2),
        },
    ),
]
"""The example jobs and their options, in declaration order (bench/tool_list_size.py declares them again
under other names)."""


def create_jobs(config: HandlesConfig | None = None) -> Handles:
    """A `Handles` instance with the three example jobs declared (configuration from the environment by default)."""
    jobs = Handles(config)
    for function, options in EXAMPLE_JOBS:
        jobs.job(**options)(function)
    return jobs


def instructions(layout: ToolLayout) -> str:
    """What the example tells a model about its tools (the same on both frameworks)."""
    names = ToolNames.of(layout)
    follow = ", ".join(names.name("<job>", verb) for verb in ("progress", "fetch", "respond", "cancel"))
    return (
        "Each long job is a tool of its own name, which answers its result when the job is quick and "
        "a handle otherwise; clients that declare the io.modelcontextprotocol/tasks extension get a task. "
        f"The handle works with {follow} (respond answers its questions); <job>_start starts a job and "
        "returns its handle at once. Each reply's `next` field says what to do next."
    )


def build_server(
    jobs: Handles, *, layout: ToolLayout = "per_job", token_verifier: Any = None, auth: Any = None
) -> MCPServer[Any]:
    """The example MCPServer: every job's tools (plain, handle and Tasks) in `layout`, and the quick tool."""
    server: MCPServer[Any] = MCPServer(
        "handles-example",
        version=version("mcp-handles"),
        instructions=instructions(layout),
        token_verifier=token_verifier,
        auth=auth,
        extensions=[jobs.tasks_extension()],
    )
    server.add_tool(lookup_account, structured_output=True)
    jobs.bind(server, layout=layout)
    return server


def build_fastmcp_server(jobs: Handles, *, layout: ToolLayout = "per_job", auth: Any = None) -> Any:
    """The same example on FastMCP 4 (`mcp-handles[fastmcp]`): the same tools, from the same `jobs`.

    `auth` is a FastMCP authentication provider (a `TokenVerifier`, say); the principal of every call
    is derived from its verified token, as on `MCPServer`.
    """
    from fastmcp import FastMCP

    server = FastMCP(
        "handles-example", version=version("mcp-handles"), instructions=instructions(layout), auth=auth
    )
    server.tool(lookup_account)
    jobs.bind(server, layout=layout)
    return server
