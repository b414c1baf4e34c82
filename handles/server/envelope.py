"""The envelope (`resultType`, `serverInfo` in `_meta`) of a result that server middleware answers itself."""

from __future__ import annotations

import copy
from typing import Any, Protocol

from mcp.server.context import ServerMiddleware, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp_types import SERVER_INFO_META_KEY, Implementation
from mcp_types.version import MODERN_PROTOCOL_VERSIONS


class SdkServer(Protocol):
    """What the SDK middleware here needs of a server: the SDK's `MCPServer`, or FastMCP's low-level
    server (the SDK's own `Server`); both hold the one middleware list of the SDK's runner."""

    @property
    def middleware(self) -> list[ServerMiddleware[Any]]: ...


def server_info(server: SdkServer) -> dict[str, Any]:
    """The `serverInfo` stamp of `server`, as the SDK writes it."""
    if not isinstance(server, MCPServer):  # the low-level server keeps the stamp it writes
        stamp: dict[str, Any] = copy.deepcopy(getattr(server, "server_info_stamp", {}))
        return stamp
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
