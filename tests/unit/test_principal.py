"""Stored principals as operators read them: every form distinct, nothing a terminal would interpret."""

from __future__ import annotations

import pytest

from handles.principal import local_form, readable, token_form


@pytest.mark.parametrize(
    ("stored", "shown"),
    [
        (token_form(None, "reports-app", "alice"), "alice (client reports-app)"),
        (token_form("https://idp", "app", "alice@corp"), "alice@corp (client app, issuer https://idp)"),
        (token_form(None, "app", None), "client app"),
        (token_form("https://idp", None, None), "client (none), issuer https://idp"),
        (token_form(None, "app", "a (client b)"), '"a (client b)" (client app)'),
        (token_form(None, "app", ""), '"" (client app)'),
        (token_form(None, "app", "\x1b[31mred"), '"\\u001b[31mred" (client app)'),
        (token_form(None, "app", "zoë"), "zoë (client app)"),
        (local_form("local"), "local local"),
        (local_form("two words"), 'local "two words"'),
        ("tenant:acme", "tenant:acme"),
        ("local alice", '"local alice"'),
        ('token:[null, "app", "alice"]', '"token:[null, \\"app\\", \\"alice\\"]"'),
        ("token:[broken", "token:[broken"),
    ],
)
def test_readable(stored: str, shown: str) -> None:
    assert readable(stored) == shown
