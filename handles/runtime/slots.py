"""This node's worker slots: every way of taking work reserves here before any await, so `max_running` holds."""

from __future__ import annotations

from collections import Counter

REMEMBERED_PRINCIPALS = 1024
"""How many of the principals served last `Slots` remembers the turn of, besides those holding a slot."""


class Slots:
    """`capacity` slots; a principal holds at most `principal_limit` of them while others wait."""

    def __init__(self, capacity: int, principal_limit: int) -> None:
        self.capacity = capacity
        self.principal_limit = principal_limit
        self._reserved = 0
        self._held: dict[str, str] = {}  # job id -> principal key
        self._by_principal: Counter[str] = Counter()
        # principal key -> serve counter when last given a slot, oldest first (see `_forget_old_turns`)
        self._served: dict[str, int] = {}
        self._serial = 0

    @property
    def free(self) -> int:
        return self.capacity - self._reserved - len(self._held)

    def reserve(self, count: int) -> int:
        """Reserve up to `count` free slots; returns how many were reserved."""
        granted = max(0, min(count, self.free))
        self._reserved += granted
        return granted

    def at_share(self, key: str) -> bool:
        """Whether principal `key` already holds its share of the slots."""
        return self._by_principal[key] >= self.principal_limit

    def reserve_for(self, key: str) -> bool:
        """Reserve one slot for a job of principal `key`, unless it already holds its share."""
        if self.at_share(key):
            return False
        return self.reserve(1) == 1

    def unreserve(self, count: int = 1) -> None:
        self._reserved = max(self._reserved - count, 0)

    def take(self, job_id: str, key: str) -> None:
        """A reserved slot now runs `job_id`."""
        self.unreserve(1)
        self._held[job_id] = key
        self._by_principal[key] += 1
        self._serial += 1
        self._served.pop(key, None)  # to the end: the dict stays in the order principals were last served
        self._served[key] = self._serial
        if len(self._served) > 2 * REMEMBERED_PRINCIPALS + len(self._by_principal):
            self._forget_old_turns()

    def _forget_old_turns(self) -> None:
        """Keep the turns of the `REMEMBERED_PRINCIPALS` principals served last and of those holding a slot."""
        recent = list(self._served.items())[-REMEMBERED_PRINCIPALS:]
        holding = {key: at for key, at in self._served.items() if key in self._by_principal}
        self._served = dict(sorted((holding | dict(recent)).items(), key=lambda entry: entry[1]))

    def release(self, job_id: str) -> None:
        key = self._held.pop(job_id, None)
        if key is not None:
            self._by_principal[key] -= 1
            if self._by_principal[key] <= 0:
                del self._by_principal[key]

    def held_by_principal(self) -> dict[str, int]:
        return dict(self._by_principal)

    def served(self) -> dict[str, int]:
        """When each remembered principal was last given a slot (a rising counter); a principal missing was
        served before all of these, or never."""
        return dict(self._served)
