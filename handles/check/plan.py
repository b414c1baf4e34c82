"""What `handles check` drives: the jobs of a `checks.toml`, their arguments, answers and what is sensitive."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from handles.errors import ConfigurationError


@dataclass(frozen=True)
class JobPlan:
    """One `[jobs.NAME]` table of a `checks.toml`."""

    name: str
    arguments: dict[str, Any]
    answer: dict[str, Any] | None = None
    cancel: bool = False
    sensitive: tuple[str, ...] = ()
    timeout: float = 60.0


@dataclass(frozen=True)
class CheckPlan:
    """Every job to drive, and the values no status message or error may ever show."""

    jobs: tuple[JobPlan, ...]
    sensitive_values: tuple[str, ...] = ()

    def secrets(self) -> list[str]:
        """Every sensitive value: the plan's, and each job's sensitive arguments and answer fields."""
        named = [({**job.arguments, **(job.answer or {})}, job.sensitive) for job in self.jobs]
        values = [
            *self.sensitive_values,
            *(str(args[name]) for args, names in named for name in names if name in args),
        ]
        return sorted({value for value in values if value})


def load_plan(path: Path) -> CheckPlan:
    """Read a `checks.toml` (docs/checking.md)."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"Cannot read the checks file {str(path)!r}: {exc}") from None
    tables = data.get("jobs") or {}
    if not isinstance(tables, dict):
        raise ConfigurationError(f"{str(path)!r}: write each job as a table of its own, [jobs.NAME].")
    jobs = [_job(path, name, table) for name, table in tables.items()]
    if not jobs:
        raise ConfigurationError(f"{str(path)!r} names no job: add a [jobs.NAME] table per job to drive.")
    return CheckPlan(tuple(jobs), tuple(str(value) for value in data.get("sensitive_values") or ()))


_SHAPES: dict[str, Any] = {
    "arguments": dict,
    "answer": dict,
    "cancel": bool,
    "sensitive": list,
    "timeout": int | float,
}
"""What each key of a `[jobs.NAME]` table holds."""


def _job(path: Path, name: str, table: Any) -> JobPlan:
    if isinstance(table, dict):
        wrong = [key for key, value in table.items() if not isinstance(value, _SHAPES.get(key, type(None)))]
    else:
        wrong = ["its value"]
    if wrong:
        raise ConfigurationError(
            f"{str(path)!r}: [jobs.{name}] may hold only arguments and answer (tables), cancel (true or false), "
            f"sensitive (a list of names) and timeout (seconds); check {', '.join(wrong)}."
        )
    return JobPlan(
        name=name,
        arguments=table.get("arguments", {}),
        answer=table.get("answer"),
        cancel=table.get("cancel", False),
        sensitive=tuple(map(str, table.get("sensitive", ()))),
        timeout=float(table.get("timeout", 60.0)),
    )
