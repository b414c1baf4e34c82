"""The operator's switches as stored (`handles_switches`, one row per switch); what they mean is
handles/switches.py's."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select as sa_select
from sqlalchemy.exc import IntegrityError

from handles.store.engine import Database
from handles.store.models import Clock, SwitchRecord

_ALL_SWITCHES = sa_select(SwitchRecord.__table__)  # type: ignore[attr-defined]


class SwitchRows(Database):
    """The switches' rows, a part of `JobRepository`."""

    clock: Clock  # set by JobRepository

    def switches(self) -> list[SwitchRecord]:
        """Every switch as last set, engaged or not."""
        with self._fast_reading() as connection:
            return [
                SwitchRecord.model_construct(**row) for row in connection.execute(_ALL_SWITCHES).mappings()
            ]

    def set_switch(
        self,
        name: str,
        *,
        engaged: bool,
        by: str,
        reason: str | None = None,
        retry_after_seconds: float | None = None,
    ) -> tuple[SwitchRecord, SwitchRecord | None]:
        """Engage or release the switch `name`, recording who did it and when: (as now set, as it was)."""
        values = {
            "engaged": engaged,
            "reason": reason,
            "retry_after_seconds": retry_after_seconds,
            "changed_by": by,
        }
        try:
            return self._set_switch(name, values)
        except IntegrityError:
            # Another operator created the same switch at the same moment: this try updates it.
            return self._set_switch(name, values)

    def _set_switch(self, name: str, values: dict[str, Any]) -> tuple[SwitchRecord, SwitchRecord | None]:
        with self._writing() as session:
            row = session.get(SwitchRecord, name, with_for_update=True)
            before = None if row is None else SwitchRecord.model_construct(**row.model_dump())
            if row is None:
                row = SwitchRecord(name=name, **values, changed_at=self.clock())
                session.add(row)
            else:
                for field, value in {**values, "changed_at": self.clock()}.items():
                    setattr(row, field, value)
            session.flush()
            return SwitchRecord.model_construct(**row.model_dump()), before
