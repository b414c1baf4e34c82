"""`check_size`: the size it judges is `json_size`'s, whatever the text holds; a lone surrogate is refused."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from handles.errors import InvalidArguments
from handles.limits import check_size, json_size

VALUES: list[Any] = [
    {"seconds": 0},
    {"text": "plain ascii", "n": [1, 2.5, None, True]},
    {"text": "caf\u00e9 \u00fcber \u4e2d\u6587", "emoji": "\U0001f600"},
    {"control": "tab\there\nline\x01\x1f", "quote": 'say "hi" \\ back'},
    {"del": "a\x7fb"},
    {"when": datetime(2030, 1, 1, tzinfo=UTC)},  # written with `default=str`
    {"nested": {"k": ["\u00e9", {"x": "\x7f"}]}},
]


@pytest.mark.parametrize("value", VALUES)
def test_the_size_checked_is_json_size(value: Any) -> None:
    size = json_size(value)
    check_size(value, size, "arguments", "next")  # at the limit: accepted
    with pytest.raises(InvalidArguments) as refused:
        check_size(value, size - 1, "arguments", "next")
    assert refused.value.data == {"limit_bytes": size - 1, "size_bytes": size}


def test_a_lone_surrogate_is_refused_whatever_the_limit() -> None:
    with pytest.raises(InvalidArguments, match="not valid Unicode"):
        check_size({"text": "a\ud800b"}, 10**6, "arguments", "next")
