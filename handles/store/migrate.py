"""Schema migrations (Alembic): bring a database to the stored shape this version of handles expects.

SQLite databases are upgraded automatically on first use (unless
`HANDLES_AUTO_MIGRATE=0`); shared databases such as PostgreSQL are upgraded by an
operator with `handles db upgrade`, and a server refuses to start on an outdated
schema rather than guess.
"""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text

from handles.errors import ConfigurationError

VERSION_TABLE = "handles_alembic_version"
_SCRIPTS = Path(__file__).resolve().parent.parent / "migrations"
_LOCK_KEY = 0x68616E646C6573  # "handles": one advisory lock for concurrent upgrades on PostgreSQL

# Keep "Running upgrade ..." lines, not the plugin chatter Alembic logs on every run.
logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(_SCRIPTS))
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(
            connection, opts={"version_table": VERSION_TABLE}
        ).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply every migration up to `revision` (default: the newest)."""
    config = _config()
    with engine.begin() as connection:
        if engine.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LOCK_KEY})
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def check_current(engine: Engine) -> None:
    """Raise `ConfigurationError` unless the database is at the newest revision."""
    current, head = current_revision(engine), head_revision()
    if current != head:
        raise ConfigurationError(
            f"The handles tables in this database are at schema revision {current or 'none'}, but this "
            f"version of handles needs {head}. Run `handles db upgrade` against HANDLES_DATABASE_URL "
            "(or set HANDLES_AUTO_MIGRATE=1 to let servers upgrade it on start)."
        )
