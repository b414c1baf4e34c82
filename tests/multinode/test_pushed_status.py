"""Pushed task status across nodes: a `subscriptions/listen` stream open on one node pushes the
`notifications/tasks` of changes made on another (PostgreSQL LISTEN/NOTIFY, not the store poll)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx2
import pytest

from tests.tasks.wire import Wire

from .conftest import Cluster

pytestmark = pytest.mark.timeout(180)


def ended(frame: dict[str, Any]) -> bool:
    return frame.get("method") == "notifications/tasks" and frame["params"]["status"] in (
        "completed",
        "failed",
        "cancelled",
    )


def pushed(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [frame["params"] for frame in frames if frame.get("method") == "notifications/tasks"]


def test_a_stream_on_one_node_pushes_what_another_node_changes(cluster: Cluster) -> None:
    # Node a runs no job and polls the store only every 30 s: whatever it pushes in time came through NOTIFY.
    a = cluster.server("a", HANDLES_RUN_WORKERS="0", HANDLES_STORE_POLL_SECONDS="30", EXAMPLE_JOB_SECONDS="3")
    b = cluster.server("b", EXAMPLE_JOB_SECONDS="3")

    async def main() -> None:
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=60)) as http:
            on_a, on_b = Wire(a.url, http), Wire(b.url, http)

            # A job created through a, run by b: every change after the start is b's.
            task_id = (await on_a.tool("export_dataset", {"rows": 1000})).result["taskId"]
            began = time.monotonic()
            reply = await on_a.listen({"taskIds": [task_id]}, until=ended, seconds=25)
            states = pushed(reply.notifications)
            assert reply.notifications[0]["params"]["notifications"] == {"taskIds": [task_id]}
            assert states and states[-1]["status"] == "completed", states
            assert time.monotonic() - began < 15
            done = {state["_meta"].get("io.github.handles/progress", {}).get("done") for state in states}
            assert len(done - {None}) >= 5, states  # pushed while it ran, not only at its end
            assert states[-1]["result"]["structuredContent"]["summary"].startswith(
                "1000 rows"
            )  # the CSV's link

            # A cancel sent to b while a listens: the cancelled state is pushed by a, at once.
            task_id = (await on_a.tool("export_dataset", {"rows": 1000})).result["taskId"]
            cancelled_at: list[float] = []

            async def cancel_on_b(_ack: dict[str, Any]) -> None:
                await asyncio.sleep(0.5)
                assert (await on_b.call("tasks/cancel", {"taskId": task_id})).status == 200
                cancelled_at.append(time.monotonic())

            reply = await on_a.listen({"taskIds": [task_id]}, until=ended, seconds=25, on_ack=cancel_on_b)
            states = pushed(reply.notifications)
            assert states[-1]["status"] == "cancelled", states
            assert time.monotonic() - cancelled_at[0] < 5

    asyncio.run(main())
