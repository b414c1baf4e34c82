"""Tool layouts: which tool names serve the jobs of one server (`"per_job"` or `"compact"`)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

from handles.errors import ConfigurationError

ToolLayout = Literal["per_job", "compact"]
LAYOUTS: tuple[str, ...] = get_args(ToolLayout)

SHARED_PREFIX = "jobs"
"""The shared tools of the compact layout are `jobs_<verb>`."""

FOLLOW_VERBS = ("progress", "fetch", "cancel", "respond")
"""The verbs that take a handle; the compact layout shares them between jobs (`start` stays per job)."""

PlainCall = Literal["adaptive", "tasks_only"]
"""What a job's plain tool `<job>` does for a caller that does not declare the Tasks extension."""
PLAIN_CALLS: tuple[str, ...] = get_args(PlainCall)

JOB_META_KEY = "io.github.handles/job"
"""`_meta` key of a job's plain tool `<job>` in `tools/list`: what a client cannot tell from the tool
names, `{"layout": "compact", "asks_input": true, "plain_call": "adaptive"}` (in the compact layout,
whether `jobs_respond` serves this job; whether `<job>` answers inline at all). Other clients ignore it."""


def job_meta(layout: ToolLayout, *, asks_input: bool, plain_call: PlainCall) -> dict[str, Any]:
    """The `_meta` of a job's plain tool (see `JOB_META_KEY`)."""
    return {JOB_META_KEY: {"layout": layout, "asks_input": asks_input, "plain_call": plain_call}}


@dataclass(frozen=True)
class ToolNames:
    """The name of each tool of a job in one layout."""

    layout: ToolLayout = "per_job"

    @classmethod
    def of(cls, layout: str) -> ToolNames:
        if layout not in LAYOUTS:
            raise ConfigurationError(
                f"Unknown tool layout {layout!r}; use one of {', '.join(repr(name) for name in LAYOUTS)}."
            )
        return cls(cast(ToolLayout, layout))

    @classmethod
    def discover(cls, job: str, listed: Collection[str]) -> ToolNames | None:
        """The layout a server's `tools/list` shows for `job`, or None when it has no handle tools for it."""
        if f"{job}_progress" in listed:
            return cls("per_job")
        if f"{SHARED_PREFIX}_progress" in listed:
            return cls("compact")
        return None

    @property
    def shared(self) -> bool:
        """Whether the handle tools are shared by every job (compact) rather than one set per job."""
        return self.layout == "compact"

    def name(self, job: str, verb: str) -> str:
        """`<job>_<verb>`, or `jobs_<verb>` for a shared verb in the compact layout."""
        if self.shared and verb in FOLLOW_VERBS:
            return f"{SHARED_PREFIX}_{verb}"
        return f"{job}_{verb}"
