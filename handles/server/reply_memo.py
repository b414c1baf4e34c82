"""The last progress reply of each recently polled job, reused while its state (compared field by field, after
the poll has checked the handle and principal) is unchanged."""

from __future__ import annotations

from typing import Generic, TypeVar

Reply = TypeVar("Reply")

REMEMBERED_JOBS = 1024
"""How many jobs' last replies a job kind's tools keep (the least recently polled go first)."""


class ReplyMemo(Generic[Reply]):
    """For each of the last `size` jobs polled, the reply built and the state it was built from."""

    def __init__(self, size: int = REMEMBERED_JOBS) -> None:
        self._size = size
        self._last: dict[str, tuple[object, Reply]] = {}

    def get(self, job_id: str, state: object) -> Reply | None:
        """The last reply built for `job_id` if it was built from a state equal to `state`, else None."""
        last = self._last.get(job_id)
        if last is None or last[0] != state:
            return None
        del self._last[job_id]
        self._last[job_id] = last  # now the most recently polled
        return last[1]

    def put(self, job_id: str, state: object, reply: Reply) -> None:
        """Remember `reply`, built from `state`, as `job_id`'s last."""
        self._last.pop(job_id, None)
        self._last[job_id] = (state, reply)
        if len(self._last) > self._size:
            del self._last[next(iter(self._last))]
