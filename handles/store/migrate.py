"""Schema migrations (Alembic): bring a database to the shape this version of handles expects."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from handles.errors import ConfigurationError

logger = logging.getLogger("handles")


@contextmanager
def _quiet_alembic() -> Iterator[None]:
    """Keep Alembic's per-run INFO lines quiet; `upgrade` logs one line of its own."""
    alembic = logging.getLogger("alembic")
    level = alembic.level
    if alembic.getEffectiveLevel() < logging.WARNING:
        alembic.setLevel(logging.WARNING)
    try:
        yield
    finally:
        alembic.setLevel(level)


with _quiet_alembic():  # importing alembic's commands sets up its plugins, logging each one
    from alembic import command
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

VERSION_TABLE = "handles_alembic_version"
_SCRIPTS = Path(__file__).resolve().parent.parent / "migrations"
_LOCK_KEY = 0x68616E646C6573  # "handles": one advisory lock for concurrent upgrades on PostgreSQL


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(_SCRIPTS))
    return config


def head_revision(scripts: ScriptDirectory | None = None) -> str:
    head = (scripts or ScriptDirectory.from_config(_config())).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection, _quiet_alembic():
        return _revision_on(connection)


def _revision_on(connection: Any) -> str | None:
    return MigrationContext.configure(
        connection, opts={"version_table": VERSION_TABLE}
    ).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply every migration up to `revision` (default: the newest); one INFO line when anything ran."""
    config = _config()
    with engine.begin() as connection, _quiet_alembic():
        if engine.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LOCK_KEY})
        before = _revision_on(connection)
        _refuse_newer(before, ScriptDirectory.from_config(config))
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
        after = _revision_on(connection)
    if after != before:
        logger.info("handles: database schema upgraded from %s to %s", before or "empty", after)


def check_current(engine: Engine) -> None:
    """Raise `ConfigurationError` unless the database is at the newest revision."""
    scripts = ScriptDirectory.from_config(_config())
    current, head = current_revision(engine), head_revision(scripts)
    _refuse_newer(current, scripts)
    if current != head:
        raise ConfigurationError(
            f"The handles tables in this database are at schema revision {current or 'none'}, but this "
            f"version of handles needs {head}. Run `handles db upgrade` against HANDLES_DATABASE_URL "
            "(or set HANDLES_AUTO_MIGRATE=1 to let servers upgrade it on start)."
        )


def _refuse_newer(current: str | None, scripts: ScriptDirectory) -> None:
    """Raise `ConfigurationError` when a newer handles made the database's revision."""
    if current is None:
        return
    if current not in {script.revision for script in scripts.walk_revisions()}:
        raise ConfigurationError(
            f"The handles tables in this database are at schema revision {current}, which a newer version of "
            f"handles made; this version knows revisions up to {head_revision(scripts)} and does not run on a newer "
            "schema. Run the newer version of handles here too (roll the code forward), or point this server at "
            "a database of its own version."
        )
