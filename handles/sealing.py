"""Sensitive (`SecretStr`) values: sealed with Fernet in the store, never shown, scrubbed from what a job writes."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from typing import Any

SEALED = "$sealed"
SHOWN = "[sensitive]"
REDACTED = "[redacted]"
_LABEL = b"handles/seal/v1"


def sensitive_fields(schema: Mapping[str, Any]) -> frozenset[str]:
    """The top-level properties of an object schema marked `writeOnly` (pydantic's `SecretStr`)."""
    properties = schema.get("properties") or {}
    return frozenset(
        name for name, prop in properties.items() if isinstance(prop, dict) and prop.get("writeOnly")
    )


def is_sealed(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {SEALED}


def shown(values: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """`values` as an operator may see them: every sealed value is `[sensitive]`."""
    if values is None:
        return None
    return {key: SHOWN if is_sealed(value) else value for key, value in values.items()}


class Sealer:
    """Seals and unseals sensitive values with keys derived from the handle signing keys (newest first)."""

    def __init__(self, secret_keys: Iterable[str]) -> None:
        from cryptography.fernet import Fernet, MultiFernet  # here: the CLI reads sealed values without it

        derived = [
            Fernet(base64.urlsafe_b64encode(hmac.new(key.encode(), _LABEL, hashlib.sha256).digest()))
            for key in secret_keys
        ]
        if not derived:
            raise ValueError("sealing needs at least one key")
        self._fernet = MultiFernet(derived)

    def seal(self, values: Mapping[str, Any], fields: frozenset[str]) -> dict[str, Any]:
        """`values` with each of `fields` present sealed."""
        if not fields:
            return dict(values)
        return {
            key: {SEALED: self._fernet.encrypt(_text(value).encode()).decode()}
            if key in fields and value is not None and not is_sealed(value)
            else value
            for key, value in values.items()
        }

    def unseal(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """`values` with every sealed value opened; raises `SealedValueUnreadable` when no key opens one."""
        opened: dict[str, Any] = {}
        for key, value in values.items():
            if is_sealed(value):
                from cryptography.fernet import InvalidToken

                try:
                    value = self._fernet.decrypt(str(value[SEALED]).encode()).decode()
                except InvalidToken:
                    raise SealedValueUnreadable(key) from None
            opened[key] = value
        return opened


class SealedValueUnreadable(Exception):
    """A sealed value no configured key opens: the key that sealed it was removed."""

    def __init__(self, field: str) -> None:
        super().__init__(
            f"The sensitive value {field!r} was sealed with a key no longer in HANDLES_SECRET_KEYS; "
            "put the old key back (after the new one) to read it."
        )


def _text(value: Any) -> str:
    reveal = getattr(value, "get_secret_value", None)
    return str(reveal() if callable(reveal) else value)


class Redactor:
    """Replaces a job's own sensitive values in text it writes for others to read."""

    MIN_LENGTH = 4
    """Shorter values are not redacted (a 1-character secret would blank every occurrence of a letter)."""

    def __init__(self) -> None:
        self._values: set[str] = set()

    def add(self, values: Mapping[str, Any], fields: Iterable[str]) -> None:
        for field in fields:
            value = values.get(field)
            if value is not None and not is_sealed(value):
                text = _text(value)
                if len(text) >= self.MIN_LENGTH:
                    self._values.add(text)

    def __call__(self, text: str | None) -> str | None:
        if text is None or not self._values:
            return text
        for value in sorted(self._values, key=len, reverse=True):
            text = text.replace(value, REDACTED)
        return text
