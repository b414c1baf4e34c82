"""A database that cannot be opened, told the operator in one sentence, password hidden."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, SQLAlchemyError

from handles.errors import ConfigurationError, DatabaseUnreachable

_REASON_LIMIT = 200


def require_existing(url: str) -> None:
    """Refuse an SQLite file that does not exist, so an operator's command never creates an empty store."""
    path = sqlite_file(url)
    if path is not None and not path.exists():
        raise ConfigurationError(
            f"There is no handles database at {url}. Set HANDLES_DATABASE_URL (or HANDLES_DATA_DIR) to the "
            "database your servers use."
        )


def shown_url(url: str) -> str:
    """`url` with its password replaced by `***` (or a placeholder when it is not a URL at all)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "(not a database URL)"


def _reason(exc: SQLAlchemyError, url: str) -> str:
    """The driver's first line ("connection refused", "password authentication failed"), without the password."""
    origin = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    lines = [line.strip() for line in str(origin).splitlines() if line.strip()]
    reason = lines[0] if lines else exc.__class__.__name__
    try:
        password = make_url(url).password
    except ArgumentError:
        password = None
    if password:
        reason = reason.replace(str(password), "***")
    return reason[:_REASON_LIMIT].rstrip(" .")


def sqlite_file(url: str) -> Path | None:
    """The file an SQLite URL names (None for another database, an in-memory one, or not a URL)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database).absolute()


def make_sqlite_folder(url: str) -> None:
    """Make the folder of an SQLite file URL, or say in one sentence why it cannot be made."""
    path = sqlite_file(url)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(
            f"Cannot make the folder {path.parent} for the SQLite database file {path.name} "
            f"({exc.strerror or exc}). Set HANDLES_DATA_DIR (or HANDLES_DATABASE_URL) to a folder this "
            "user may create and write."
        ) from None


@contextmanager
def database_errors(url: str) -> Iterator[None]:
    """Raise a one-sentence `ConfigurationError` for a database URL that cannot be used."""
    try:
        yield
    except ConfigurationError:
        raise
    except (ArgumentError, NoSuchModuleError) as exc:
        raise ConfigurationError(
            f"HANDLES_DATABASE_URL is not a valid database URL ({exc}). Set it to an SQLAlchemy URL such as "
            "sqlite:///path/to/handles.db or postgresql+psycopg://user@host:5432/db."
        ) from None
    except ModuleNotFoundError as exc:
        raise ConfigurationError(
            f"The database driver {exc.name!r} for {shown_url(url)} is not installed. Install it "
            "(for PostgreSQL: pip install 'mcp-handles[postgres]') and start again."
        ) from None
    except SQLAlchemyError as exc:
        path = sqlite_file(url)
        if path is not None:
            raise ConfigurationError(
                f"Cannot open the SQLite database file {path} in the folder {path.parent} "
                f"({_reason(exc, url)}). Check that the folder exists and that this user may read and write "
                "it and the file, or set HANDLES_DATA_DIR (or HANDLES_DATABASE_URL) to another place."
            ) from None
        raise DatabaseUnreachable(
            f"Cannot reach the database at {shown_url(url)} ({_reason(exc, url)}). Check HANDLES_DATABASE_URL, "
            "that the database server is running and accepts connections from here, and the credentials."
        ) from None
