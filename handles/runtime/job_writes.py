"""What a running job writes to its own stored state: its progress, its questions, its durable steps."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from handles.store import StepRecord, run_shielded

if TYPE_CHECKING:
    from handles.store import Change, InputRequestRecord, Store

__all__ = ["JobWrites", "StepRecord"]

T = TypeVar("T")


@dataclass(eq=False)
class JobWrites:
    """The writes of one run of one job, made as `owner`, the node that holds its lease: each raises
    `LeaseLost` once the job is no longer this run's, and `StoreUnavailable` while the database is down."""

    store: Store
    job_id: str
    owner: str

    async def _write(self, change: Change, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`method(job_id, owner, *args, **kwargs)` on the store, as this run."""
        return await self.store.write(self.job_id, change, method, self.job_id, self.owner, *args, **kwargs)

    async def progress(self, done: float | None, total: float | None, message: str | None) -> None:
        """Store the job's latest progress report."""
        await self._write("reported", self.store.repo.set_progress, done, total, message)

    async def open_question(
        self, key: str, text: str, requested: dict[str, Any]
    ) -> InputRequestRecord | None:
        """Store the question `key`; the stored request if it was answered already (a replay), else None."""
        return await self._write("changed", self.store.repo.open_input, key, text, requested)

    async def begin_step(self, name: str, attempt: int, *, repeatable: bool) -> tuple[StepRecord, bool]:
        """Record that step `name` starts, unless it is already known: (record, fresh)."""
        repo = self.store.repo
        # Its start time fixed here: a try again after an outage knows its own committed start by it.
        return await self._write(
            "reported", repo.begin_step, name, attempt, started_at=repo.clock(), repeatable=repeatable
        )

    async def finish_step(
        self, name: str, attempt: int, *, result: Any = None, error: str | None = None
    ) -> None:
        """Record the outcome of step `name`, started in `attempt`: its JSON result, or the error it raised."""
        repo = self.store.repo
        await self._write("reported", repo.finish_step, name, result=result, error=error, attempt=attempt)

    @staticmethod
    async def to_the_end(work: Coroutine[Any, Any, T]) -> T:
        """Await `work` in a task of its own that no cancellation of the caller stops (`run_shielded`)."""
        return await run_shielded(work)
