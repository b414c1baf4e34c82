"""Writing a job's `ResultFile` into the store, in parts, before its result (a link to them) is stored."""

from __future__ import annotations

import contextlib
import hashlib
import secrets

import anyio

from handles.results import PART_BYTES, URI_SCHEME, ResultFile, ResultLink, is_text
from handles.store import Store


class ResultTooLarge(Exception):
    """A result file grew past `HandlesConfig.max_result_file_bytes`."""


def _cut(buffer: bytearray, limit: int, text: bool) -> int:
    """Where the next part ends: at `limit`, moved back to a UTF-8 character boundary for text."""
    cut = min(limit, len(buffer))
    if text:
        while 0 < cut < len(buffer) and (buffer[cut] & 0xC0) == 0x80:
            cut -= 1
    return cut


async def write_result_file(store: Store, job_id: str, file: ResultFile, *, max_bytes: int) -> ResultLink:
    """Store `file` in parts under a new file id and return its link (the result isn't stored yet)."""
    file_id = secrets.token_hex(16)
    text = is_text(file.media_type)
    digest = hashlib.sha256()
    buffer = bytearray()
    size = part = 0

    async def put(data: bytes) -> None:
        nonlocal part
        await store.call(store.repo.put_result_part, job_id, file_id, part, data)
        part += 1

    try:
        async for chunk in file.chunks():
            size += len(chunk)
            if size > max_bytes:
                raise ResultTooLarge(f"The job's result file is larger than the {max_bytes} byte limit.")
            digest.update(chunk)
            buffer += chunk
            while len(buffer) >= PART_BYTES:
                cut = _cut(buffer, PART_BYTES, text)
                await put(bytes(buffer[:cut]))
                del buffer[:cut]
        if buffer or part == 0:
            await put(bytes(buffer))
    except BaseException:
        # Nothing half stored: the parts written so far go (the job's deletion would take them later).
        if part:
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await store.call(store.repo.drop_result_file, job_id, file_id)
        raise
    return ResultLink(
        uri=f"{URI_SCHEME}://results/{job_id}/{file_id}",
        name=file.name,
        media_type=file.media_type,
        size_bytes=size,
        parts=part,
        sha256=digest.hexdigest(),
        summary=file.summary,
    )
