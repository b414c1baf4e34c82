"""Who a request speaks for: the verified access token's identity, else the configured local principal."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

PrincipalResolver = Callable[[Any], Awaitable[str | None] | str | None]
"""Gets the request context (the SDK's `Context`, or None outside a request) and returns a principal."""


def token_principal() -> str | None:
    """The principal of the verified access token of the current request, if there is one."""
    # Imported here: the operator's CLI reads principals (below) without loading the MCP SDK.
    from mcp.server.auth.middleware.auth_context import get_access_token
    from mcp.server.auth.provider import principal_components

    token = get_access_token()
    if token is None:
        return None
    client_id, issuer, subject = principal_components(token)
    return token_form(issuer, client_id, subject)


TOKEN_PREFIX = "token:"
LOCAL_PREFIX = "local:"


def token_form(issuer: str | None, client_id: str | None, subject: str | None) -> str:
    """The stored principal of a verified token: `token:` and the compact JSON `[issuer,client_id,subject]`."""
    return TOKEN_PREFIX + json.dumps([issuer, client_id, subject], separators=(",", ":"))


def local_form(name: str) -> str:
    """The stored principal of unauthenticated requests: `local:` and the configured local principal."""
    return LOCAL_PREFIX + name


def default_resolver(local_principal: str) -> PrincipalResolver:
    """Token principal when the request is authenticated, else `local_principal`."""

    def resolve(_context: Any) -> str:
        return token_principal() or local_form(local_principal)

    return resolve


def _token_components(principal: str) -> tuple[str | None, str | None, str | None] | None:
    """(issuer, client_id, subject) of a principal in the token form; None for any other principal."""
    if not principal.startswith(TOKEN_PREFIX + "["):
        return None
    try:
        parts = json.loads(principal.removeprefix(TOKEN_PREFIX))
    except ValueError:
        return None
    if not (
        isinstance(parts, list) and len(parts) == 3 and all(p is None or isinstance(p, str) for p in parts)
    ):
        return None
    if token_form(*parts) != principal:
        return None
    return parts[0], parts[1], parts[2]


_PLAIN_EXCLUDED = set(' ()",\\')


def _shown(value: str) -> str:
    """A component as is when it is plain; JSON-quoted when it is empty or holds spaces, brackets,
    commas, quotes or characters a terminal would interpret (so no rendering can pass for another)."""
    if value and value.isprintable() and not _PLAIN_EXCLUDED.intersection(value):
        return value
    return json.dumps(value, ensure_ascii=not value.isprintable())


def readable(principal: str) -> str:
    """A stored principal as an operator reads it: `SUBJECT (client CLIENT_ID)` or `local NAME`, quoted
    where needed so that two principals never read the same."""
    components = _token_components(principal)
    if components is not None:
        issuer, client_id, subject = components
        details = "client " + ("(none)" if client_id is None else _shown(client_id))
        if issuer is not None:
            details += ", issuer " + _shown(issuer)
        return details if subject is None else f"{_shown(subject)} ({details})"
    if principal.startswith(LOCAL_PREFIX):
        return "local " + _shown(principal.removeprefix(LOCAL_PREFIX))
    return _shown(principal)


ANY = None
"""In a `PrincipalMatch` pattern: any run of characters (SQL `%`)."""


@dataclass(frozen=True)
class PrincipalMatch:
    """The stored principals an operator's `--principal VALUE` means, for the store to find in SQL."""

    exact: tuple[str, ...]
    patterns: tuple[tuple[str | None, ...], ...]


def principal_match(value: str) -> PrincipalMatch:
    """What `--principal VALUE` matches: the stored form, a local name, a token's subject or client id."""
    encoded = json.dumps(value)  # the encoding `token_form` gives a component
    prefix = TOKEN_PREFIX + "["
    return PrincipalMatch(
        exact=(value, local_form(value)),
        patterns=(
            (prefix, ANY, f",{encoded}]"),  # the subject: the last component
            (prefix, ANY, f",{encoded},null]"),  # the client id, before no subject
            (prefix, ANY, f',{encoded},"', ANY, '"]'),  # the client id, before a subject
        ),
    )
