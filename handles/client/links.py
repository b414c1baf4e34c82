"""Reading a large result through its link, one `resources/read` a part, checked against its `sha256`."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

from mcp import Client
from mcp_types import BlobResourceContents, TextResourceContents

from handles.results import ResultLink


class LinkReadError(Exception):
    """The bytes read through a link are not the result it describes (size or SHA-256 differ)."""


async def read_link(client: Client, link: ResultLink | Mapping[str, Any]) -> AsyncIterator[bytes]:
    """Yield a linked result's bytes part by part (one `resources/read` each); raises `LinkReadError` at
    the end when they do not match the link's size and SHA-256."""
    link = link if isinstance(link, ResultLink) else ResultLink.model_validate(dict(link))
    uris = [link.uri] if link.parts == 1 else [link.part_uri(part) for part in range(link.parts)]
    digest = hashlib.sha256()
    size = 0
    for uri in uris:
        for content in (await client.read_resource(uri)).contents:
            if isinstance(content, TextResourceContents):
                data = content.text.encode()
            elif isinstance(content, BlobResourceContents):
                data = base64.b64decode(content.blob)
            else:  # pragma: no cover - the protocol knows only these two
                raise LinkReadError(f"{uri} answered an unknown content type")
            digest.update(data)
            size += len(data)
            yield data
    if size != link.size_bytes or digest.hexdigest() != link.sha256:
        raise LinkReadError(
            f"{link.uri}: read {size} bytes with SHA-256 {digest.hexdigest()}, but the link describes "
            f"{link.size_bytes} bytes with {link.sha256}; read it again."
        )
