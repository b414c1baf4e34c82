"""Configuration: every knob, its environment variable and its default, in one place."""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, ConfigDict, Field, Strict, TypeAdapter, ValidationError, model_validator
from pydantic.dataclasses import dataclass
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from handles.errors import ConfigurationError
from handles.limits import MAX_RESULT_BYTES

logger = logging.getLogger("handles")

DEFAULT_DATA_DIR = ".handles"
DEV_KEY_FILE = "dev-secret-key"
MIN_KEY_LENGTH = 32

_FLAGS = dict.fromkeys(("1", "true", "yes", "on"), True) | dict.fromkeys(("0", "false", "no", "off"), False)


def _from_text(parse: Callable[[str], Any]) -> BeforeValidator:
    """An environment value is text: `parse` reads it; values given in Python are checked strictly."""
    return BeforeValidator(lambda value: parse(value) if isinstance(value, str) else value)


Integer = Annotated[int, Strict(), _from_text(int)]
Number = Annotated[float, Strict(), _from_text(float)]
Flag = Annotated[bool, Strict(), _from_text(lambda text: _FLAGS.get(text.lower(), text))]
Names = Annotated[
    tuple[str, ...], _from_text(lambda text: tuple(n.strip() for n in text.split(",") if n.strip()))
]


# Each field is read from HANDLES_<NAME> (except HANDLES_SWEEP_SECONDS); unknown names are refused.
_VARIABLES_OF_FIELDS = ConfigDict(
    alias_generator=lambda n: "HANDLES_" + n.upper(), populate_by_name=True, extra="forbid"
)


@dataclass(frozen=True, config=_VARIABLES_OF_FIELDS)
class HandlesConfig:
    """Settings of one `Handles` instance; `secret_keys` is newest first (the first signs, every key verifies)."""

    database_url: str = ""
    secret_keys: Names = ()
    dev_mode: Flag = False
    data_dir: Path = Path(DEFAULT_DATA_DIR)
    local_principal: str = "local"
    max_running: Annotated[Integer, Field(ge=1)] = 32
    max_wait_seconds: Annotated[Number, Field(ge=0)] = 50.0
    max_active_per_principal: Annotated[Integer, Field(ge=1)] = 50
    # A dead node's jobs are taken over within the lease plus one sweep.
    lease_seconds: Annotated[Number, Field(gt=0)] = 15.0
    heartbeat_seconds: Annotated[Number, Field(gt=0)] = 2.0
    sweep_interval_seconds: Annotated[Number, Field(gt=0, alias="HANDLES_SWEEP_SECONDS")] = 5.0
    store_poll_seconds: Annotated[Number, Field(gt=0)] = 1.0
    cancel_grace_seconds: Annotated[Number, Field(ge=0)] = 5.0
    progress_flush_seconds: Annotated[Number, Field(ge=0)] = 0.1
    run_workers: Flag = True
    auto_migrate: Flag | None = None
    inline_budget_seconds: Annotated[Number, Field(ge=0)] = 20.0
    # How long a stopping node lets running jobs finish before it hands the rest over.
    drain_seconds: Annotated[Number, Field(ge=0)] = 25.0
    # How long a cancel or a shutdown waits for an executing step before it is recorded outcome-unknown.
    step_cancel_limit_seconds: Annotated[Number, Field(ge=0)] = 60.0
    # The share of this node's slots one principal may hold while another principal's jobs wait.
    principal_share: Annotated[Number, Field(gt=0, le=1)] = 0.5
    # A result whose JSON is larger than this is answered as a link (a job's own setting wins).
    link_results_over: Annotated[Integer, Field(ge=1, le=MAX_RESULT_BYTES)] = 256 * 1024
    # The largest result file one job may store; a larger one fails the job (`result_too_large`).
    max_result_file_bytes: Annotated[Integer, Field(ge=0)] = 2 * 1024 * 1024 * 1024
    # How long a deleted job's evidence (handles.store.audit) is kept; 0 keeps none.
    audit_retention_seconds: Annotated[Number, Field(ge=0)] = 365 * 24 * 3600.0
    # How long a node trusts its copy of the operator's switches before it reads them again.
    switch_cache_seconds: Annotated[Number, Field(ge=0, le=60)] = 2.0
    # Switches pinned by this node's configuration, whatever the store says.
    tasks_off: Flag = False
    paused_jobs: Names = ()

    @model_validator(mode="wrap")
    @classmethod
    def _refuse_bad_values(cls, values: Any, validate: Callable[[Any], HandlesConfig]) -> HandlesConfig:
        try:
            return validate(values)
        except ValidationError as error:
            raise ConfigurationError(" ".join(map(_refusal, error.errors()))) from None

    @property
    def heartbeat_interval(self) -> float:
        """How often a node renews the leases of the jobs it runs: `heartbeat_seconds`, but at least three
        times per lease, so one late beat never loses a lease."""
        return max(min(self.heartbeat_seconds, self.lease_seconds / 3), 0.05)

    @property
    def principal_slot_limit(self) -> int:
        """How many of this node's slots one principal may hold while others wait (at least one)."""
        return max(1, int(self.max_running * self.principal_share))

    @classmethod
    def from_env(cls, **overrides: Any) -> HandlesConfig:
        """Read `HANDLES_*` variables; keyword overrides win over the environment."""
        environment = {k: v.strip() for k, v in os.environ.items() if k in _VARIABLES and v.strip()}
        config = TypeAdapter(cls).validate_python(environment)
        return replace(config, **overrides) if overrides else config

    def resolved_database_url(self) -> str:
        """The configured URL, or an SQLite file under `data_dir`."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'handles.db').as_posix()}"

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


_FIELDS: dict[str, FieldInfo] = HandlesConfig.__pydantic_fields__  # type: ignore[attr-defined]
_VARIABLES = frozenset(str(field.alias) for field in _FIELDS.values())


def _refusal(error: ErrorDetails) -> str:
    """`HANDLES_X='value' is not valid: ...`, or `HandlesConfig.x=value (HANDLES_X) ...` for Python's."""
    key = str(error["loc"][0]) if error["loc"] else ""
    name, field = next(((n, f) for n, f in _FIELDS.items() if key in (n, f.alias)), (key, None))
    if field is None:
        return f"HandlesConfig({key}={error['input']!r}) is not valid: {error['msg']}."
    given = (
        f"{key}={error['input']!r}"
        if key == field.alias
        else f"HandlesConfig.{name}={error['input']!r} ({field.alias})"
    )
    return f"{given} is not valid: {_accepted(field, error)}."


def _accepted(field: FieldInfo, error: ErrorDetails) -> str:
    bounds = {k: getattr(m, k) for m in field.metadata for k in ("ge", "gt", "le") if hasattr(m, k)}
    low = bounds.get("gt", bounds.get("ge"))
    if error["type"].startswith("bool"):
        return "use one of true/false, 1/0, yes/no, on/off (or leave it unset)"
    if low is None:
        return str(error["msg"])
    kind = "an integer" if field.annotation is int else "a number"
    if "le" in bounds:
        return f"use {kind} between {low}{' (exclusive)' if 'gt' in bounds else ''} and {bounds['le']}"
    return f"use {kind} {'greater than' if 'gt' in bounds else 'at least'} {low}"
