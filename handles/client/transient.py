"""What both clients share about failed requests: which are transient, and 401/403 as `AuthenticationError`."""

from __future__ import annotations

import json
from typing import Any

import anyio
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, INTERNAL_ERROR, REQUEST_TIMEOUT

TRANSIENT_MCP_CODES = frozenset({CONNECTION_CLOSED, REQUEST_TIMEOUT, INTERNAL_ERROR})
"""JSON-RPC errors after which the same request may simply be sent again."""

AUTHENTICATION_FAILED = -32030
"""Client-side only: the JSON-RPC error a 401/403 answer becomes (see `handles.client.http_client`), outside
the codes MCP uses."""

CANCEL_TIMEOUT_SECONDS = 5.0
"""How long a client tries to cancel a job or task it abandons (shielded, best effort) before giving up."""


class AuthenticationError(Exception):
    """The server refused the credential (HTTP 401) or the permission (HTTP 403). Retrying will not help."""

    def __init__(self, status: int, detail: str | None = None) -> None:
        self.status = status
        self.detail = detail
        super().__init__(authentication_message(status, detail))


_WHY_REFUSED = {
    401: "HTTP 401: the server requires a valid bearer token and this request had none, or one it does not "
    "accept (unknown or expired). Pass a valid token, e.g. connect(url, token=...).",
    403: "HTTP 403: the server accepted the credential but refuses this request with it (a missing scope "
    "or permission). Use a token that grants access.",
}


def authentication_message(status: int, detail: str | None = None) -> str:
    why = _WHY_REFUSED[403 if status == 403 else 401]
    return f"Authentication failed ({why})" + (f" Server said: {detail}" if detail else "")


def json_object(content: str | bytes) -> dict[str, Any] | None:
    """`content` read as a JSON object; None when it is not one (a refusal's body may be anything)."""
    try:
        value = json.loads(content)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, or `exc` itself."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def authentication_error(exc: BaseException) -> AuthenticationError | None:
    """The `AuthenticationError` that `exc` stands for (a 401/403 answer), if it is one."""
    for leaf in leaves(exc):
        if isinstance(leaf, AuthenticationError):
            return leaf
        if isinstance(leaf, MCPError) and leaf.error.code == AUTHENTICATION_FAILED:
            data: Any = leaf.error.data if isinstance(leaf.error.data, dict) else {}
            status = data.get("httpStatus")
            if status in (401, 403):
                return AuthenticationError(status, data.get("detail"))
    return None


def is_transient(exc: BaseException) -> bool:
    """A failure after which the same request may be sent again: a lost connection, a timeout, a -32603."""
    if isinstance(
        exc,
        OSError | TimeoutError | anyio.BrokenResourceError | anyio.ClosedResourceError | anyio.EndOfStream,
    ):
        return True
    return isinstance(exc, MCPError) and exc.error.code in TRANSIENT_MCP_CODES


def unreadable_cause(exc: BaseException) -> BaseException | None:
    """Why a server could not be read at all, to report: its refusal of the credentials, or the failed
    connection; None when `exc` is neither (a fault to raise)."""
    refused = authentication_error(exc)
    return refused or (leaves(exc)[0] if is_connection_failure(exc) else None)


def is_connection_failure(exc: BaseException) -> bool:
    """A transient error, or a transport's crash (e.g. `httpx2.ConnectError`), anywhere inside `exc`."""
    return any(
        is_transient(leaf)
        or type(leaf).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore", "httpcore2")
        for leaf in leaves(exc)
    )
