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

logger = logging.getLogger("handles")

DEFAULT_DATA_DIR = ".handles"
DEV_KEY_FILE = "dev-secret-key"
MIN_KEY_LENGTH = 32


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigurationError(f"{name}={raw!r} is not a number; set it to a number of seconds.") from None


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigurationError(f"{name}={raw!r} is not an integer.") from None


def _env_optional_bool(name: str) -> bool | None:
    raw = os.environ.get(name)
    return None if raw is None or raw == "" else _env_bool(name, False)


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


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
            max_running=_env_int("HANDLES_MAX_RUNNING", cls.max_running),
            max_wait_seconds=_env_float("HANDLES_MAX_WAIT_SECONDS", cls.max_wait_seconds),
            max_active_per_principal=_env_int(
                "HANDLES_MAX_ACTIVE_PER_PRINCIPAL", cls.max_active_per_principal
            ),
            lease_seconds=_env_float("HANDLES_LEASE_SECONDS", cls.lease_seconds),
            heartbeat_seconds=_env_float("HANDLES_HEARTBEAT_SECONDS", cls.heartbeat_seconds),
            sweep_interval_seconds=_env_float("HANDLES_SWEEP_SECONDS", cls.sweep_interval_seconds),
            store_poll_seconds=_env_float("HANDLES_STORE_POLL_SECONDS", cls.store_poll_seconds),
            cancel_grace_seconds=_env_float("HANDLES_CANCEL_GRACE_SECONDS", cls.cancel_grace_seconds),
            progress_flush_seconds=_env_float("HANDLES_PROGRESS_FLUSH_SECONDS", cls.progress_flush_seconds),
            run_workers=_env_bool("HANDLES_RUN_WORKERS", True),
            auto_migrate=_env_optional_bool("HANDLES_AUTO_MIGRATE"),
            inline_budget_seconds=_env_float("HANDLES_INLINE_BUDGET_SECONDS", cls.inline_budget_seconds),
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
