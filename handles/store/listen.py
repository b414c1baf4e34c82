"""Cross-node wake-ups on PostgreSQL: LISTEN for the change notices other nodes NOTIFY."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import get_args

import psycopg
from sqlalchemy.engine import make_url

from handles.store.engine import NOTIFY_CHANNEL
from handles.store.repository import Change

_CHANGES: dict[str, Change] = {change: change for change in get_args(Change)}

logger = logging.getLogger("handles.store")


def libpq_url(sqlalchemy_url: str) -> str:
    """The plain libpq URL for a `postgresql+psycopg://` SQLAlchemy URL."""
    return make_url(sqlalchemy_url).set(drivername="postgresql").render_as_string(hide_password=False)


class ChangeListener:
    """Calls `on_change(job_id, change)` for each change other nodes publish."""

    def __init__(self, url: str, origin: str, on_change: Callable[[str, Change], None]) -> None:
        self._url = libpq_url(url)
        self._origin = origin
        self._on_change = on_change
        self.connected = asyncio.Event()

    async def run(self) -> None:
        """Listen until cancelled, reconnecting after failures."""
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self._url, autocommit=True) as connection:
                    await connection.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    schema = await (await connection.execute("SELECT current_schema()")).fetchone()
                    own = schema[0] if schema is not None else None
                    self.connected.set()
                    async for notice in connection.notifies():
                        job_id, origin, event, scope = [*notice.payload.split(" ", 3), "", "", ""][:4]
                        if origin != self._origin and scope in ("", own):
                            self._on_change(job_id, _CHANGES.get(event, "changed"))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.connected.clear()
                logger.warning("lost the PostgreSQL change listener (%s); polling until it is back", exc)
                await asyncio.sleep(1.0)
