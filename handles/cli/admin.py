"""`handles keygen`, `db upgrade`, `worker` and `console`: keys, schema and the processes besides MCP servers."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import secrets
import sys
from typing import TYPE_CHECKING, Any

from handles.cli.common import open_repository
from handles.config import MIN_KEY_LENGTH, HandlesConfig
from handles.errors import ConfigurationError
from handles.store import JobRepository, migrate
from handles.store.reach import database_errors, make_sqlite_folder

if TYPE_CHECKING:
    from handles.app import Handles


def keygen(_args: argparse.Namespace) -> int:
    key = secrets.token_urlsafe(48)
    assert len(key) >= MIN_KEY_LENGTH
    print(key)
    return 0


def db_upgrade(args: argparse.Namespace) -> int:
    config = HandlesConfig.from_env()
    url = args.database_url or config.resolved_database_url()
    make_sqlite_folder(url)  # as a server does: the default `.handles/` may not exist yet
    with database_errors(url):
        repository = JobRepository(url)
        try:
            before = migrate.current_revision(repository.engine)
            migrate.upgrade(repository.engine)
            after = migrate.current_revision(repository.engine)
        finally:
            repository.dispose()
    change = f"{before or 'empty'} -> {after}" if before != after else f"{after} (current)"
    print(f"handles schema: {change}")
    return 0


def load_app(spec: str) -> Handles:
    """`module:attribute`, where the attribute is a `Handles` or a function returning one."""
    from handles.app import Handles

    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"--app {spec!r}: use the form module:attribute, e.g. myservice.jobs:jobs")
    sys.path.insert(0, os.getcwd())
    try:
        target: Any = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"--app {spec!r}: cannot load it ({exc})") from exc
    app = target() if callable(target) and not isinstance(target, Handles) else target
    if not isinstance(app, Handles):
        raise ConfigurationError(f"--app {spec!r} is a {type(app).__name__}, not a handles.Handles")
    return app


def worker(args: argparse.Namespace) -> int:
    app = load_app(args.app or os.environ.get("HANDLES_APP", ""))
    # A worker always runs jobs, whatever HANDLES_RUN_WORKERS says for the web nodes.
    app.reconfigure(run_workers=True)

    async def run() -> None:
        from handles.server.serving import shutdown_signals

        stop = asyncio.Event()
        # A signal drains (running jobs may finish for HANDLES_DRAIN_SECONDS); a second one hands them over now.
        with shutdown_signals(app, stop):
            async with app.running():
                logging.getLogger("handles").info(
                    "worker %s running jobs %s", app.runtime.owner, ", ".join(sorted(app.specs))
                )
                await stop.wait()

    asyncio.run(run())
    return 0


CONSOLE_TOKEN_ENV = "HANDLES_CONSOLE_TOKEN"


def console(args: argparse.Namespace) -> int:
    """Serve the operator console alone, on the configured database; never without a token."""
    import uvicorn

    from handles.console import console_app

    token = os.environ.get(CONSOLE_TOKEN_ENV, "")
    if len(token) < 16:
        raise ConfigurationError(
            f"Set {CONSOLE_TOKEN_ENV} to a secret of at least 16 characters (`handles keygen` makes one): "
            "the console shows and steers every job, so it never starts open."
        )
    url = args.database_url or HandlesConfig.from_env().resolved_database_url()
    open_repository(url).dispose()  # reachable and current, or a clear error now
    app = console_app(url, token=token)
    logging.getLogger("handles").info("operator console on http://%s:%d/", args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
