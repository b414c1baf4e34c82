"""An httpx client for the SDK's Streamable HTTP transport that keeps 401/403 recognisable, not a retryable -32603."""

from __future__ import annotations

import json

import httpx2
from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT

from handles.client.transient import AUTHENTICATION_FAILED, authentication_message, json_object


class _AuthenticationAnswers(httpx2.AsyncBaseTransport):
    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if response.status_code not in (401, 403) or request.method != "POST":
            return response
        await response.aread()
        await response.aclose()
        detail = _detail(response)
        error = {
            "code": AUTHENTICATION_FAILED,
            "message": authentication_message(response.status_code, detail),
            "data": {"httpStatus": response.status_code, "detail": detail},
        }
        body = {"jsonrpc": "2.0", "id": (json_object(request.content) or {}).get("id"), "error": error}
        return httpx2.Response(
            response.status_code,
            headers={"content-type": "application/json"},
            content=json.dumps(body).encode(),
            request=request,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


def _detail(response: httpx2.Response) -> str | None:
    """The server's own words: an OAuth error body's description, else the WWW-Authenticate header."""
    body = json_object(response.content) or {}
    said = body.get("error_description") or body.get("error")
    return said if isinstance(said, str) else response.headers.get("www-authenticate")


def http_client(
    *, token: str | None = None, headers: dict[str, str] | None = None, timeout: httpx2.Timeout | None = None
) -> httpx2.AsyncClient:
    """An `httpx2.AsyncClient` for `streamable_http_client(url, http_client=...)`, with a bearer `token` if given."""
    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    return httpx2.AsyncClient(
        headers=sent,
        timeout=timeout or httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT),
        transport=_AuthenticationAnswers(httpx2.AsyncHTTPTransport()),
    )
