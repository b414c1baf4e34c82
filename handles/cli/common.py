"""What the `handles` commands share: the job store, a job found by id or handle, and one-line text."""

from __future__ import annotations

import getpass
import os
from datetime import datetime

from handles.config import HandlesConfig
from handles.errors import ConfigurationError
from handles.handle import HandleCodec
from handles.store import JobRecord, JobRepository, migrate
from handles.store.reach import database_errors, require_existing


def open_repository(url: str | None = None) -> JobRepository:
    """The configured job store, checked to be reachable and current; clear errors otherwise."""
    config = HandlesConfig.from_env()
    url = url or config.resolved_database_url()
    require_existing(url)
    with database_errors(url):
        repository = JobRepository(url)
        migrate.check_current(repository.engine)
    return repository


def find_job(repository: JobRepository, ident: str) -> JobRecord:
    """A job by id or by handle (any principal's: this is the operator's view)."""
    job_id = ident
    if "." in ident:
        claims = HandleCodec(HandlesConfig.from_env().resolved_secret_keys()).inspect(ident)
        if claims is None:
            raise ConfigurationError(
                "That handle was not signed by any key in HANDLES_SECRET_KEYS (or it is damaged). "
                "Pass the job id instead, or configure the key that signed it."
            )
        job_id = claims.job_id
    job = repository.get(job_id)
    if job is None:
        raise ConfigurationError(f"No job {job_id!r} in this database (it may have expired and been purged).")
    return job


def operator_name() -> str:
    """The default `--by`: the operating-system user running the command."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no user name in the environment and no passwd entry for the uid
        return f"uid {os.getuid()}"


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def _clip(text: str, width: int) -> str:
    """`text` within `width` characters, ending in `...` when cut (ASCII: any terminal encoding shows it)."""
    if len(text) <= width:
        return text
    return text[: width - 3] + "..." if width > 3 else text[:width]
