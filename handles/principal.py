"""Who a request speaks for.

With a token verifier, the principal is derived from the verified access token
(issuer, client and subject, as the SDK's `principal_components` defines them),
never from anything the client sends in arguments. Without authentication (stdio,
or an HTTP server with no verifier), every request speaks for the configured local
principal and a handle is a bearer capability. Other setups pass their own
resolver to `Handles(principal_resolver=...)`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import principal_components

PrincipalResolver = Callable[[Any], Awaitable[str | None] | str | None]
"""Gets the request context (the SDK's `Context`, or None outside a request) and returns a principal."""


def token_principal() -> str | None:
    """The principal of the verified access token of the current request, if there is one."""
    token = get_access_token()
    if token is None:
        return None
    client_id, issuer, subject = principal_components(token)
    return "token:" + json.dumps([issuer, client_id, subject], separators=(",", ":"))


def default_resolver(local_principal: str) -> PrincipalResolver:
    """Token principal when the request is authenticated, else `local_principal`."""

    def resolve(_context: Any) -> str:
        return token_principal() or f"local:{local_principal}"

    return resolve
