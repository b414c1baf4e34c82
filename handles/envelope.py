"""The envelope of a result that server middleware answers itself, without the SDK's handler.

The SDK shapes a handler's result inside the middleware chain, so a middleware that answers
without `call_next` owns the envelope: on 2026-07-28 that is `resultType` and the `serverInfo`
stamp in `_meta`, as the SDK puts them on every other result (mcp/server/runner.py `_serialize`).
"""

from __future__ import annotations

import copy
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp_types import SERVER_INFO_META_KEY, Implementation
from mcp_types.version import MODERN_PROTOCOL_VERSIONS


def server_info(server: MCPServer[Any]) -> dict[str, Any]:
    """The `serverInfo` stamp of `server`, as the SDK writes it."""
    info = Implementation(
        name=server.name,
        title=server.title,
        version=server.version,
        description=server.description,
        website_url=server.website_url,
        icons=server.icons,
    )
    return info.model_dump(by_alias=True, mode="json", exclude_none=True)


def enveloped(
    ctx: ServerRequestContext[Any, Any], result: dict[str, Any], info: dict[str, Any]
) -> dict[str, Any]:
    """`result` as the SDK would send it on this request's protocol version."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        result["resultType"] = "complete"
        result["_meta"] = {**(result.get("_meta") or {}), SERVER_INFO_META_KEY: copy.deepcopy(info)}
    return result
