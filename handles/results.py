"""Large results: a result too big for a model's context is stored in parts and answered as a link."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any

from mcp_types import CallToolResult, ResourceLink, TextContent
from pydantic import BaseModel, Field

PART_BYTES = 1024 * 1024
"""The most one part (one `resources/read`) carries: what a read holds in memory, on either side."""

URI_SCHEME = "handles"
LINK_META = "dev.handles/resultLink"
"""The `_meta` key of a linked result that carries its `ResultLink` (for `_fetch` and clients)."""

_TEXT_TYPES = frozenset({"application/json", "application/xml", "application/yaml", "application/x-ndjson"})

Chunk = bytes | str
Content = Chunk | Iterable[Chunk] | AsyncIterable[Chunk]


def is_text(media_type: str) -> bool:
    """Whether parts of this media type are read as text (UTF-8), not as base64 blobs."""
    base = media_type.split(";", 1)[0].strip().lower()
    return base.startswith("text/") or base in _TEXT_TYPES or base.endswith(("+json", "+xml"))


class ResultLink(BaseModel):
    """Where a large result is and what it is: what a reply carries instead of the result itself."""

    uri: str = Field(
        description="resources/read it (when parts > 1: uri/parts/0 .. uri/parts/<parts-1>, joined)."
    )
    name: str
    media_type: str
    size_bytes: int
    parts: int
    sha256: str
    summary: str | None = None

    def part_uri(self, part: int) -> str:
        return f"{self.uri}/parts/{part}"

    @property
    def read_hint(self) -> str:
        """One sentence saying how to read it."""
        if self.parts == 1:
            return f"Read it with resources/read of {self.uri}."
        return (
            f"Read it with resources/read in {self.parts} parts, {self.part_uri(0)} up to "
            f"{self.part_uri(self.parts - 1)}, and join them in order."
        )


@dataclass
class ResultFile:
    """What a job returns for a result that should not travel inline: a file read through a link.

    `content` is bytes, text, or an (async) iterable of chunks, stored as they come. Annotate the job
    `-> ResultFile`.
    """

    content: Content
    _: KW_ONLY
    media_type: str = "application/octet-stream"
    name: str = "result"
    summary: str | None = None

    @classmethod
    def of_result(cls, result: dict[str, Any], kind: str) -> ResultFile:
        """A stored tool result too large to travel inline, as a JSON file."""
        structured = result.get("structuredContent")
        if structured is not None:
            return cls(
                json.dumps(structured, ensure_ascii=False), media_type="application/json", name=f"{kind}.json"
            )
        return cls(text_of(result), media_type="text/plain", name=f"{kind}.txt")

    async def chunks(self) -> AsyncIterable[bytes]:
        content = self.content
        if isinstance(content, AsyncIterable):
            async for chunk in content:
                yield _encoded(chunk)
        else:
            for chunk in [content] if isinstance(content, bytes | str) else content:
                yield _encoded(chunk)


def _encoded(chunk: Chunk) -> bytes:
    if isinstance(chunk, str):
        return chunk.encode()
    if isinstance(chunk, bytes | bytearray | memoryview):
        return bytes(chunk)
    raise TypeError(f"a ResultFile chunk must be bytes or str, not {type(chunk).__name__}")


def link_size_text(link: ResultLink, *, declared: bool) -> str:
    """What a linked result is, as the end of a sentence: a file, when the link is the job's declared result
    (a `ResultFile` job, whatever its size), or a result linked because it is too large to show inline."""
    what = f"{link.size_bytes} bytes of {link.media_type} ({link.name})"
    return f"a file, {what}." if declared else f"{what}, too large to show here."


def linked_result(link: ResultLink, *, structured: bool) -> dict[str, Any]:
    """The stored `CallToolResult` of a linked result: a sentence, the `resource_link`, the metadata."""
    dumped = link.model_dump(mode="json")
    sentence = f"The result is {link_size_text(link, declared=structured)} {link.read_hint}" + (
        f" Summary: {link.summary}" if link.summary else ""
    )
    result = CallToolResult(
        content=[TextContent(type="text", text=sentence), resource_link(link)],
        structured_content=dumped if structured else None,
        _meta={LINK_META: dumped},
    )
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


def resource_link(link: ResultLink) -> ResourceLink:
    """The `resource_link` content item of a linked result."""
    return ResourceLink(
        type="resource_link",
        uri=link.uri,
        name=link.name,
        mime_type=link.media_type,
        size=link.size_bytes,
        description=link.summary,
    )


def link_of(result: dict[str, Any] | None) -> ResultLink | None:
    """The link of a stored result that is linked, else None."""
    meta = (result or {}).get("_meta") or {}
    dumped = meta.get(LINK_META)
    return None if dumped is None else ResultLink.model_validate(dumped)


def text_of(result: CallToolResult | Mapping[str, Any] | None) -> str:
    """The text of a tool result's content: its text blocks, joined by newlines ("" when it has none)."""
    if isinstance(result, CallToolResult):
        result = result.model_dump(by_alias=True, exclude_none=True)
    blocks = (result or {}).get("content") or []
    return "\n".join(
        str(b.get("text", "")) for b in blocks if isinstance(b, dict) and b.get("type") == "text"
    )


def tool_error_text(result: CallToolResult | Mapping[str, Any] | None) -> str:
    """What a tool error (`isError`) said, for a caller: its text, or a sentence when it has none."""
    return text_of(result) or "The job reported an error."
