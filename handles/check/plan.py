"""What `handles check` drives: the jobs of a `checks.toml`, their arguments, answers and what is sensitive."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, StrictBool, ValidationError

from handles.errors import ConfigurationError


class JobPlan(BaseModel):
    """One `[jobs.NAME]` table of a `checks.toml`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    arguments: dict[str, Any] = {}
    answer: dict[str, Any] | None = None
    cancel: StrictBool = False
    sensitive: tuple[str, ...] = ()
    timeout: float = 60.0


class LoadPlan(BaseModel):
    """The `[load]` table: what the opt-in load gate drives, and the limits the server declares."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job: str | None = None
    starts: int = 4
    limit: int | None = None
    refusal: str = "limit_reached"
    seconds: float = 60.0
    retention: float | None = None


@dataclass(frozen=True)
class CheckPlan:
    """Every job to drive, the values no status message or error may ever show, and the load to drive."""

    jobs: tuple[JobPlan, ...]
    sensitive_values: tuple[str, ...] = ()
    load: LoadPlan | None = None

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
    named = {
        name: {"name": name, **table} if isinstance(table, dict) else table for name, table in tables.items()
    }
    jobs = [_table(path, f"jobs.{name}", JobPlan, table) for name, table in named.items()]
    if not jobs:
        raise ConfigurationError(f"{str(path)!r} names no job: add a [jobs.NAME] table per job to drive.")
    load = _table(path, "load", LoadPlan, data["load"]) if "load" in data else None
    return CheckPlan(tuple(jobs), tuple(str(value) for value in data.get("sensitive_values") or ()), load)


Plan = TypeVar("Plan", bound=BaseModel)


def _table(path: Path, where: str, plan: type[Plan], table: Any) -> Plan:
    """`table` read as a `plan`, or what is wrong with it."""
    try:
        return plan.model_validate(table)
    except ValidationError as exc:
        wrong = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'its value'}: {e['msg']}" for e in exc.errors())
        raise ConfigurationError(f"{str(path)!r}: [{where}] {wrong} (see docs/checking.md).") from None
