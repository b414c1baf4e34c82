"""Settings from HANDLES_* variables and from Python: the spellings, types and ranges each accepts, and
refusals that name every bad setting with what it accepts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from handles.config import HandlesConfig
from handles.errors import ConfigurationError
from handles.limits import MAX_RESULT_BYTES


@pytest.fixture(autouse=True)
def _no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in [name for name in os.environ if name.startswith("HANDLES_")]:
        monkeypatch.delenv(variable)


def refusal(monkeypatch: pytest.MonkeyPatch, **variables: str) -> str:
    for variable, value in variables.items():
        monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError) as refused:
        HandlesConfig.from_env()
    return str(refused.value)


def test_an_empty_environment_gives_the_defaults_and_a_direct_build_reads_no_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert HandlesConfig.from_env() == HandlesConfig()
    monkeypatch.setenv("HANDLES_MAX_RUNNING", "-3")
    monkeypatch.setenv("HANDLES_DATA_DIR", "")  # empty is unset
    assert HandlesConfig().max_running == 32 and HandlesConfig.max_running == 32


def test_every_setting_is_read_from_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    values = {
        "HANDLES_DATABASE_URL": "sqlite:///elsewhere.db",
        "HANDLES_SECRET_KEYS": " " + "n" * 40 + ", ," + "o" * 40,
        "HANDLES_DATA_DIR": "/srv/handles",
        "HANDLES_LOCAL_PRINCIPAL": "alice",
        "HANDLES_MAX_RUNNING": " 7 ",
        "HANDLES_SWEEP_SECONDS": "0.5",
        "HANDLES_AUTO_MIGRATE": "0",
        "HANDLES_AUDIT_RETENTION_SECONDS": "0",
        "HANDLES_LINK_RESULTS_OVER": str(MAX_RESULT_BYTES),
    }
    for variable, value in values.items():
        monkeypatch.setenv(variable, value)
    config = HandlesConfig.from_env(local_principal="bob")  # an override wins over the environment
    assert config.database_url == "sqlite:///elsewhere.db" and config.data_dir == Path("/srv/handles")
    assert config.secret_keys == ("n" * 40, "o" * 40) and config.local_principal == "bob"
    assert (config.max_running, config.sweep_interval_seconds, config.auto_migrate) == (7, 0.5, False)
    assert config.audit_retention_seconds == 0 and config.link_results_over == MAX_RESULT_BYTES
    monkeypatch.setenv("HANDLES_SWEEP_INTERVAL_SECONDS", "9")  # the field's name is not a variable
    assert HandlesConfig.from_env().sweep_interval_seconds == 0.5


@pytest.mark.parametrize(
    ("spelling", "value"),
    [(s, True) for s in ("1", "true", "YES", "On")] + [(s, False) for s in ("0", "False", "no", "OFF")],
)
def test_a_boolean_takes_the_same_spellings_in_any_case(
    monkeypatch: pytest.MonkeyPatch, spelling: str, value: bool
) -> None:
    monkeypatch.setenv("HANDLES_RUN_WORKERS", spelling)
    monkeypatch.setenv("HANDLES_AUTO_MIGRATE", spelling)
    config = HandlesConfig.from_env()
    assert config.run_workers is value and config.auto_migrate is value


@pytest.mark.parametrize(
    ("variable", "value", "accepted"),
    [
        ("HANDLES_DEV_MODE", "t", "use one of true/false, 1/0, yes/no, on/off (or leave it unset)"),
        ("HANDLES_TASKS_OFF", "enabled", "use one of true/false, 1/0, yes/no, on/off (or leave it unset)"),
        ("HANDLES_MAX_RUNNING", "1.5", "use an integer at least 1"),
        ("HANDLES_MAX_RUNNING", "1.0", "use an integer at least 1"),
        ("HANDLES_MAX_RESULT_FILE_BYTES", "-1", "use an integer at least 0"),
        ("HANDLES_DRAIN_SECONDS", "nan", "use a number at least 0"),
        ("HANDLES_HEARTBEAT_SECONDS", "0", "use a number greater than 0"),
        ("HANDLES_PRINCIPAL_SHARE", "0", "use a number between 0 (exclusive) and 1"),
        ("HANDLES_SWITCH_CACHE_SECONDS", "60.5", "use a number between 0 and 60"),
        (
            "HANDLES_LINK_RESULTS_OVER",
            str(MAX_RESULT_BYTES + 1),
            f"use an integer between 1 and {MAX_RESULT_BYTES}",
        ),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable_the_value_and_what_it_accepts(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, accepted: str
) -> None:
    assert refusal(monkeypatch, **{variable: value}) == f"{variable}={value!r} is not valid: {accepted}."


def test_every_bad_setting_is_named_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    message = refusal(
        monkeypatch, HANDLES_MAX_RUNNING="0", HANDLES_LEASE_SECONDS="soon", HANDLES_DEV_MODE="y"
    )
    for named in ("HANDLES_MAX_RUNNING='0'", "HANDLES_LEASE_SECONDS='soon'", "HANDLES_DEV_MODE='y'"):
        assert named in message, message


def test_values_given_in_python_are_checked_with_the_same_types_and_ranges() -> None:
    with pytest.raises(ConfigurationError) as refused:
        HandlesConfig(max_running=0)
    assert str(refused.value) == (
        "HandlesConfig.max_running=0 (HANDLES_MAX_RUNNING) is not valid: use an integer at least 1."
    )
    for bad in ({"max_running": 1.5}, {"max_running": True}, {"principal_share": 1.5}, {"dev_mode": "maybe"}):
        with pytest.raises(ConfigurationError, match=f"HandlesConfig.{next(iter(bad))}="):
            HandlesConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="max_runing"):
        HandlesConfig(max_runing=2)  # type: ignore[call-arg]
    config = HandlesConfig(data_dir="here", secret_keys=["k" * 40], lease_seconds=3)  # type: ignore[arg-type]
    assert config.data_dir == Path("here") and config.secret_keys == ("k" * 40,) and config.lease_seconds == 3
