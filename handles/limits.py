"""Bounds on what callers and jobs may store, and the cleaning of text shown to callers."""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

from handles.errors import InvalidArguments

MAX_STATUS_MESSAGE = 500
MAX_ARGUMENTS_BYTES = 64 * 1024
MAX_RESULT_BYTES = 1024 * 1024
MAX_RESPONSE_BYTES = 16 * 1024
MAX_IDEMPOTENCY_KEY = 200

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2064\ufeff]")


# Beyond the ranges above: bidi isolates, tag characters, soft hyphens, lone surrogates... every
# control (Cc), format (Cf), surrogate (Cs) and line or paragraph separator (Zl, Zp) character.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def clean_message(text: str | None, limit: int = MAX_STATUS_MESSAGE) -> str | None:
    """`text` without control or invisible formatting characters, at most `limit` characters."""
    if text is None:
        return None
    cleaned = _CONTROL.sub(" ", str(text))
    if not cleaned.isascii():
        cleaned = "".join(" " if unicodedata.category(ch) in _HIDDEN_CATEGORIES else ch for ch in cleaned)
    cleaned = cleaned.strip()
    if len(cleaned) > limit:
        cleaned = cleaned[: limit - 1].rstrip() + "\u2026"
    return cleaned


def json_size(value: Any) -> int:
    """The size in bytes of `value` as compact JSON."""
    if type(value) is SizedJSON:
        return len(value.text)  # ASCII-only JSON: a character is a byte
    return len(json.dumps(value, separators=(",", ":"), default=str).encode())


class SizedJSON(dict[str, Any]):
    """A JSON object with its compact JSON text, made once: its size is that text's, and the store writes that text."""

    __slots__ = ("text",)
    text: str


def sized_json(value: dict[str, Any]) -> SizedJSON:
    """`value` with its compact JSON text (ASCII-only, as `json_size` counts it)."""
    sized = SizedJSON(value)
    sized.text = json.dumps(value, separators=(",", ":"), default=str)
    return sized


def stored_json(value: Any) -> str:
    """The JSON text the store writes for `value` (every engine's `json_serializer`): a `SizedJSON`'s own
    text, else `json.dumps`, SQLAlchemy's default."""
    if type(value) is SizedJSON:
        return value.text
    return json.dumps(value)


def check_size(value: Any, limit: int, what: str, next_step: str) -> None:
    """Raise `InvalidArguments` when `value` serialises to more than `limit` bytes, or is not valid Unicode."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    if text.isascii() and "\x7f" not in text:
        # The same figure as `json_size`, from the same text.
        size = len(text)
    else:
        try:
            text.encode()
        except UnicodeEncodeError:
            # A lone surrogate (JSON "\ud800") parses, but can be neither hashed nor stored.
            raise InvalidArguments(
                f"The {what} contain text that is not valid Unicode (a lone surrogate such as \\ud800).",
                next_step,
            ) from None
        size = json_size(value)
    if size > limit:
        raise InvalidArguments(
            f"The {what} are {size} bytes of JSON; the limit is {limit} bytes.",
            next_step,
            data={"limit_bytes": limit, "size_bytes": size},
        )
