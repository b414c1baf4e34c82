"""Configuration: every knob, its environment variable and its default, in one place.

`HandlesConfig.from_env()` reads the environment; tests and embedders build a
`HandlesConfig` directly. docs/operations.md lists the same table for operators.
"""

from __future__ import annotations

import logging
import os
import secrets
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from handles.errors import ConfigurationError
from handles.limits import MAX_RESULT_BYTES

logger = logging.getLogger("handles")

DEFAULT_DATA_DIR = ".handles"
DEV_KEY_FILE = "dev-secret-key"
MIN_KEY_LENGTH = 32


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True)
class _Bound:
    """What a numeric setting accepts: `low` (inclusive unless `above`), `high` (inclusive)."""

    low: float
    above: bool = False
    high: float | None = None
    integer: bool = False

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a number"
        low = f"{self.low:g}"
        if self.high is not None:
            return (
                f"{kind} between {low} (exclusive) and {self.high:g}"
                if self.above
                else (f"{kind} between {low} and {self.high:g}")
            )
        return f"{kind} greater than {low}" if self.above else f"{kind} at least {low}"

    def accepts(self, value: float) -> bool:
        if (self.above and value <= self.low) or (not self.above and value < self.low):
            return False
        return self.high is None or value <= self.high


# field -> (environment variable, what it accepts); booleans and strings are read separately.
_NUMBERS: dict[str, tuple[str, _Bound]] = {
    "max_running": ("HANDLES_MAX_RUNNING", _Bound(1, integer=True)),
    "max_wait_seconds": ("HANDLES_MAX_WAIT_SECONDS", _Bound(0)),
    "max_active_per_principal": ("HANDLES_MAX_ACTIVE_PER_PRINCIPAL", _Bound(1, integer=True)),
    "lease_seconds": ("HANDLES_LEASE_SECONDS", _Bound(0, above=True)),
    "heartbeat_seconds": ("HANDLES_HEARTBEAT_SECONDS", _Bound(0, above=True)),
    "sweep_interval_seconds": ("HANDLES_SWEEP_SECONDS", _Bound(0, above=True)),
    "store_poll_seconds": ("HANDLES_STORE_POLL_SECONDS", _Bound(0, above=True)),
    "cancel_grace_seconds": ("HANDLES_CANCEL_GRACE_SECONDS", _Bound(0)),
    "progress_flush_seconds": ("HANDLES_PROGRESS_FLUSH_SECONDS", _Bound(0)),
    "inline_budget_seconds": ("HANDLES_INLINE_BUDGET_SECONDS", _Bound(0)),
    "drain_seconds": ("HANDLES_DRAIN_SECONDS", _Bound(0)),
    "step_cancel_limit_seconds": ("HANDLES_STEP_CANCEL_LIMIT_SECONDS", _Bound(0)),
    "principal_share": ("HANDLES_PRINCIPAL_SHARE", _Bound(0, above=True, high=1)),
    "link_results_over": ("HANDLES_LINK_RESULTS_OVER", _Bound(1, integer=True, high=MAX_RESULT_BYTES)),
    "max_result_file_bytes": ("HANDLES_MAX_RESULT_FILE_BYTES", _Bound(0, integer=True)),
    "audit_retention_seconds": ("HANDLES_AUDIT_RETENTION_SECONDS", _Bound(0)),
    "switch_cache_seconds": ("HANDLES_SWITCH_CACHE_SECONDS", _Bound(0, high=60)),
}


def _env_number(field: str, default: float) -> float:
    variable, bound = _NUMBERS[field]
    raw = os.environ.get(variable, "").strip()
    if raw == "":
        return default
    try:
        value: float = int(raw) if bound.integer else float(raw)
    except ValueError:
        raise ConfigurationError(f"{variable}={raw!r} is not valid: use {bound.describe()}.") from None
    if not bound.accepts(value):
        raise ConfigurationError(f"{variable}={raw!r} is not valid: use {bound.describe()}.")
    return value


def _env_optional_bool(name: str) -> bool | None:
    raw = os.environ.get(name, "").strip()
    return None if raw == "" else _env_bool(name, False)


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "").strip()
    if raw == "":
        return default
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise ConfigurationError(
        f"{name}={raw!r} is not valid: use one of true/false, 1/0, yes/no, on/off (or leave it unset)."
    )


@dataclass(frozen=True)
class HandlesConfig:
    """Settings of one `Handles` instance.

    `secret_keys` is newest first: the first key signs new handles, every key verifies.
    """

    database_url: str = ""
    secret_keys: tuple[str, ...] = ()
    dev_mode: bool = False
    data_dir: Path = Path(DEFAULT_DATA_DIR)
    local_principal: str = "local"
    max_running: int = 32
    max_wait_seconds: float = 50.0
    max_active_per_principal: int = 50
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 2.0
    sweep_interval_seconds: float = 5.0
    store_poll_seconds: float = 1.0
    cancel_grace_seconds: float = 5.0
    progress_flush_seconds: float = 0.1
    run_workers: bool = True
    auto_migrate: bool | None = None
    inline_budget_seconds: float = 20.0
    # A stopping node lets running jobs finish this long, then hands the rest over (fits a 30 s
    # termination window with room for the HTTP server's own shutdown).
    drain_seconds: float = 25.0
    # How long a cancel or a shutdown waits for a durable step that is executing; past it the
    # step is recorded as outcome-unknown.
    step_cancel_limit_seconds: float = 60.0
    # The share of this node's slots one principal may hold while another principal's jobs wait.
    principal_share: float = 0.5
    # A result whose JSON is larger than this is stored as a file and answered as a link to read
    # (handles.results); a job's own `link_results_over` wins.
    link_results_over: int = 256 * 1024
    # The largest result file one job may store; a larger one fails the job (`result_too_large`).
    max_result_file_bytes: int = 2 * 1024 * 1024 * 1024
    # How long a deleted job's evidence (handles.store.audit) is kept; 0 keeps none.
    audit_retention_seconds: float = 365 * 24 * 3600.0
    # How long a node trusts its copy of the operator's switches (handles/switches.py) before it reads
    # them again: a switch set with the `handles` command takes effect on every node within this.
    switch_cache_seconds: float = 2.0
    # Switches pinned by this node's configuration, engaged whatever the store says: no new tasks
    # through the Tasks face, and no new starts of these job kinds.
    tasks_off: bool = False
    paused_jobs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for field, (variable, bound) in _NUMBERS.items():
            value = getattr(self, field)
            if not bound.accepts(value):
                raise ConfigurationError(
                    f"HandlesConfig.{field}={value!r} ({variable}) is not valid: use {bound.describe()}."
                )

    @property
    def principal_slot_limit(self) -> int:
        """How many of this node's slots one principal may hold while others wait (at least one)."""
        return max(1, int(self.max_running * self.principal_share))

    @classmethod
    def from_env(cls, **overrides: Any) -> HandlesConfig:
        """Read `HANDLES_*` variables; keyword overrides win over the environment."""
        data_dir = Path(os.environ.get("HANDLES_DATA_DIR") or DEFAULT_DATA_DIR)
        keys = tuple(k.strip() for k in os.environ.get("HANDLES_SECRET_KEYS", "").split(",") if k.strip())
        config = cls(
            database_url=os.environ.get("HANDLES_DATABASE_URL", ""),
            secret_keys=keys,
            dev_mode=_env_bool("HANDLES_DEV_MODE", False),
            data_dir=data_dir,
            local_principal=os.environ.get("HANDLES_LOCAL_PRINCIPAL") or "local",
            **{field: _env_number(field, getattr(cls, field)) for field in _NUMBERS},  # type: ignore[arg-type]
            run_workers=_env_bool("HANDLES_RUN_WORKERS", True),
            auto_migrate=_env_optional_bool("HANDLES_AUTO_MIGRATE"),
            tasks_off=_env_bool("HANDLES_TASKS_OFF", False),
            paused_jobs=tuple(
                name.strip() for name in os.environ.get("HANDLES_PAUSED_JOBS", "").split(",") if name.strip()
            ),
        )
        return replace(config, **overrides) if overrides else config

    def resolved_database_url(self) -> str:
        """The configured URL, or an SQLite file under `data_dir`."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'handles.db').as_posix()}"

    def resolved_auto_migrate(self) -> bool:
        """Upgrade the schema on start? Default: yes for an SQLite file, no for a shared database."""
        if self.auto_migrate is not None:
            return self.auto_migrate
        return self.resolved_database_url().startswith("sqlite")

    def resolved_secret_keys(self) -> tuple[str, ...]:
        """The signing keys, newest first. Without keys, only development mode may go on."""
        if self.secret_keys:
            for key in self.secret_keys:
                if len(key) < MIN_KEY_LENGTH:
                    raise ConfigurationError(
                        f"A key in HANDLES_SECRET_KEYS is {len(key)} characters long; use at least "
                        f"{MIN_KEY_LENGTH} random characters (`handles keygen` makes one)."
                    )
            return self.secret_keys
        if not self.dev_mode:
            raise ConfigurationError(
                "No handle signing key is configured. Set HANDLES_SECRET_KEYS to a secret of at least "
                f"{MIN_KEY_LENGTH} characters (`handles keygen` makes one), or set HANDLES_DEV_MODE=1 "
                "to use a throw-away development key."
            )
        return (self._development_key(),)

    def _development_key(self) -> str:
        path = self.data_dir / DEV_KEY_FILE
        if path.exists():
            key = path.read_text().strip()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            key = secrets.token_urlsafe(48)
            path.write_text(key)
            path.chmod(0o600)
        logger.warning(
            "HANDLES DEVELOPMENT MODE: handles are signed with a development key stored in %s. "
            "Never run like this in production: set HANDLES_SECRET_KEYS instead.",
            path,
        )
        return key
