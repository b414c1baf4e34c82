"""`resources/read` of a large result's link: authorized like a handle, answered one part at a time."""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, BlobResourceContents, ReadResourceResult, TextResourceContents

from handles.errors import CallerError, UnknownResultLink
from handles.principal import PrincipalResolver
from handles.results import URI_SCHEME, ResultLink, is_text, link_of
from handles.server.bind_mcpserver import resolve_principal
from handles.server.envelope import SdkServer, enveloped, server_info
from handles.states import Status

if TYPE_CHECKING:
    from handles.job_operations import JobOperations

_LINK = re.compile(
    rf"^(?i:{URI_SCHEME})://results/(?P<job>[A-Za-z0-9_-]{{1,64}})/(?P<file>[0-9a-f]{{32}})(?:/parts/(?P<part>\d{{1,9}}))?$"
)


def unknown_link(uri: str) -> UnknownResultLink:
    return UnknownResultLink(
        f"No result is readable at {uri}.",
        "Use the exact uri of a result_link that a fetch (or the job's own call) answered you; "
        "links end when their job's retention ends: start the job again if you still need it.",
    )


async def read_part(service: JobOperations, principal: str, uri: str) -> tuple[ResultLink, int, bytes]:
    """The link, the part number and the bytes `uri` names, for `principal`; else `UnknownResultLink`."""
    target = _LINK.match(uri)
    if target is None:
        raise unknown_link(uri)
    job_id, file_id = target["job"], target["file"]
    await service.ensure_running()
    job = await service.store.read(service.store.repo.get, job_id)
    if job is None or job.principal != principal or job.expires_at <= service.clock():
        raise unknown_link(uri)
    link = link_of(job.result) if job.status == Status.COMPLETED else None
    if link is None or not link.uri.endswith(f"/{file_id}"):
        raise unknown_link(uri)
    if target["part"] is None and link.parts > 1:
        raise UnknownResultLink(
            f"This result is {link.size_bytes} bytes in {link.parts} parts; it is not read whole.",
            link.read_hint,
            data={"parts": link.parts, "first_part": link.part_uri(0)},
        )
    part = int(target["part"] or 0)
    if part >= link.parts:
        raise unknown_link(uri)
    data = await service.store.read(service.store.repo.result_part, job_id, file_id, part)
    if data is None:
        raise unknown_link(uri)
    return link, part, data


def contents(
    uri: str, link: ResultLink, part: int, data: bytes
) -> TextResourceContents | BlobResourceContents:
    """One part on the wire, with the result's media type and where it sits in the whole."""
    meta = {"part": part, "parts": link.parts, "size_bytes": link.size_bytes, "sha256": link.sha256}
    if is_text(link.media_type):
        return TextResourceContents(uri=uri, mime_type=link.media_type, text=data.decode(), _meta=meta)
    return BlobResourceContents(
        uri=uri, mime_type=link.media_type, blob=base64.b64encode(data).decode(), _meta=meta
    )


class ResultLinks:
    """Server middleware answering `resources/read` of result links; every other request passes on."""

    def __init__(self, server: SdkServer, service: JobOperations, resolver: PrincipalResolver) -> None:
        self.server = server
        self.service = service
        self.resolver = resolver
        self._info = server_info(server)

    @classmethod
    def install(cls, server: SdkServer, service: JobOperations, resolver: PrincipalResolver) -> None:
        if not any(isinstance(middleware, cls) for middleware in server.middleware):
            server.middleware.append(cls(server, service, resolver))

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method != "resources/read" or not isinstance(ctx.params, Mapping):
            return await call_next(ctx)
        uri = ctx.params.get("uri")
        if not isinstance(uri, str) or uri[: len(URI_SCHEME) + 3].lower() != f"{URI_SCHEME}://":
            return await call_next(ctx)
        principal = await resolve_principal(
            self.resolver,
            Context(
                request_context=ctx, mcp_server=self.server if isinstance(self.server, MCPServer) else None
            ),
        )
        try:
            link, part, data = await read_part(self.service, principal, uri)
        except CallerError as error:
            raise MCPError(
                code=INVALID_PARAMS,
                message=f"{error.message} {error.next_step}",
                data=error.to_dict() | {"uri": uri},
            ) from None
        result = ReadResourceResult(contents=[contents(uri, link, part, data)])
        return enveloped(ctx, result.model_dump(by_alias=True, mode="json", exclude_none=True), self._info)
