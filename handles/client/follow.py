"""`follow`: one call follows one job to its end, resuming from the journal after any interruption; and
`connect`, the factory of clients it can re-open after a lost connection."""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from os import PathLike
from typing import Any

from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from handles.client.follower import Follower, Prefer
from handles.client.http import http_client
from handles.client.journal import Journal
from handles.client.manifest import Connect
from handles.client.outcomes import InputCallback, ProgressCallback
from handles.client.tasks import TasksClientExtension
from handles.tasks_wire import TASKS_EXTENSION


def connect(
    server: Any, *, token: str | None = None, headers: dict[str, str] | None = None, **options: Any
) -> Connect:
    """A factory of `mcp.Client(server, **options)` that declare the Tasks extension; a URL's clients send
    `token` as a bearer token and keep 401/403 recognisable."""
    extensions = list(options.pop("extensions", None) or ())
    if not any(getattr(e, "identifier", None) == TASKS_EXTENSION for e in extensions):
        extensions.append(TasksClientExtension())
    if not (isinstance(server, str) and server.startswith(("http://", "https://"))):
        if token is not None or headers is not None:
            raise ValueError("token= and headers= apply to a server given by its http(s) URL")
        return functools.partial(Client, server, extensions=extensions, **options)

    @asynccontextmanager
    async def open_client() -> AsyncIterator[Client]:
        async with (
            http_client(token=token, headers=headers) as http,
            Client(
                streamable_http_client(server, http_client=http), extensions=extensions, **options
            ) as client,
        ):
            yield client

    open_client.server_id = server.split("?", 1)[0]  # type: ignore[attr-defined]
    return open_client


async def follow(
    client: Client | Connect,
    job: str,
    arguments: dict[str, Any] | None = None,
    *,
    key: str | None = None,
    journal: Journal | str | PathLike[str] | None = None,
    on_progress: ProgressCallback | None = None,
    on_input: InputCallback | None = None,
    deadline: float | timedelta | datetime | None = None,
    cancel_on_abandon: bool = False,
    prefer: Prefer = "auto",
    server_id: str | None = None,
    long_poll_seconds: float = 15.0,
    request_timeout: float = 30.0,
    retries: int = 3,
    jitter: float = 0.2,
) -> dict[str, Any]:
    """Start `job` (or resume the one `key` names) and follow it to its end; returns its structured result.

    - `client`: a connected `mcp.Client`, or a factory of them; only with a factory can `follow` open a
      new connection when one is lost (at most `retries` failures in a row).
    - `key`: the caller's stable name for this unit of work; with a `journal` a later call resumes it.
    - `deadline`: seconds (or a `timedelta`) from now, or an aware `datetime`; absolute for this call.
    - `on_input(key, message, requested_schema)` answers the job's questions; None declines (cancels).
    - `cancel_on_abandon`: cancel the job when this call stops following it before it ends.
    - `prefer`: "auto" (Tasks when both sides support it, else the handle tools), "tasks" or "handles".
    - `server_id`: the server's stable name in the journal (default: its URL or command line).

    Raises a `FollowError` subclass for every ending other than a result.
    """
    if prefer not in ("auto", "tasks", "handles"):
        raise ValueError("prefer must be 'auto', 'tasks' or 'handles'")
    follower = Follower(
        client=client,
        job=job,
        arguments=dict(arguments or {}),
        key=key or f"{job}-{uuid.uuid4().hex}",
        journal=journal if isinstance(journal, Journal) else Journal(journal or ":memory:"),
        on_progress=on_progress,
        on_input=on_input,
        deadline=deadline,
        cancel_on_abandon=cancel_on_abandon,
        prefer=prefer,
        server_id=server_id,
        long_poll_seconds=long_poll_seconds,
        request_timeout=request_timeout,
        retries=retries,
        jitter=jitter,
    )
    return await follower.run()
