"""Large results as links: stored in parts, answered as bounded metadata, read back authorized.

In-process through the official client, with jobs written for the tests: a `ResultFile` of text
whose multi-byte characters straddle part boundaries, a binary file, a structured result past its
job's `link_results_over`, a file past `max_result_file_bytes`, and the end of retention.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import BlobResourceContents, ResourceLink, TextContent, TextResourceContents
from pydantic import BaseModel
from sqlalchemy import text

from handles import Handles, JobContext, ResultFile
from handles.client import Journal, LinkReadError, follow, read_link
from handles.client.tasks import TasksClientExtension
from handles.results import PART_BYTES
from tests.support import ToolClient, connect, handles_config

# 3 bytes per character in UTF-8: a part boundary at 1 MiB falls inside a character unless moved.
TEXT = "€uro-" * (PART_BYTES // 7 * 3)
BLOB = bytes(range(256)) * (PART_BYTES // 256 + 1000)


class Rows(BaseModel):
    rows: list[dict[str, Any]]


def declare(jobs: Handles) -> None:
    @jobs.job
    async def essay(ctx: JobContext, chunked: bool = True) -> ResultFile:
        """Returns a text file larger than two parts, in chunks (or whole)."""
        pieces = [TEXT[i : i + 100_003] for i in range(0, len(TEXT), 100_003)] if chunked else TEXT
        return ResultFile(
            pieces, media_type="text/plain; charset=utf-8", name="essay.txt", summary="An essay."
        )

    @jobs.job
    async def picture(ctx: JobContext) -> ResultFile:
        """Returns a binary file from an async iterator."""

        async def chunks() -> AsyncIterator[bytes]:
            for start in range(0, len(BLOB), 300_000):
                yield BLOB[start : start + 300_000]

        return ResultFile(chunks(), media_type="image/x-test", name="picture.bin")

    @jobs.job(link_results_over=2_000)
    async def table(ctx: JobContext, count: int) -> Rows:
        """A structured result, linked when its JSON passes 2,000 bytes."""
        return Rows(rows=[{"id": i, "name": f"row {i}"} for i in range(count)])

    @jobs.job
    async def tiny(ctx: JobContext) -> ResultFile:
        """A result file of one small part."""
        return ResultFile("a,b\n1,2\n", media_type="text/csv", name="tiny.csv")


@pytest.fixture
async def rig(
    tmp_path: Path, signing_key: str, database_url: str
) -> AsyncIterator[tuple[Handles, ToolClient]]:
    """The test jobs served in-process, on an SQLite file and on PostgreSQL."""
    jobs = Handles(
        handles_config(
            tmp_path / "data",
            [signing_key],
            database_url=database_url,
            auto_migrate=True,
            max_result_file_bytes=3 * PART_BYTES,
        )
    )
    declare(jobs)
    server: MCPServer[Any] = MCPServer("links", extensions=[jobs.tasks_extension()])
    jobs.bind(server)
    try:
        async with connect(server, forbidden=[signing_key]) as client:
            client.server = server  # type: ignore[attr-defined]
            yield jobs, client
    finally:
        await jobs.aclose()


async def finished(client: ToolClient, job: str, **arguments: Any) -> dict[str, Any]:
    started = await client.call(f"{job}_start", arguments)
    done = await client.call(f"{job}_fetch", {"handle": started["handle"], "wait_seconds": 30})
    assert done["status"] == "completed", done.data
    return dict(done.data)


async def read_all(client: Client, link: dict[str, Any]) -> bytes:
    """Join every part of `link`, checking each part's place in the whole."""
    joined = b""
    for part in range(link["parts"]):
        uri = f"{link['uri']}/parts/{part}" if link["parts"] > 1 else link["uri"]
        read = await client.read_resource(uri)
        (content,) = read.contents
        assert content.mime_type == link["media_type"] and str(content.uri) == uri
        assert (
            content.meta is not None
            and content.meta["part"] == part
            and content.meta["parts"] == link["parts"]
        )
        if isinstance(content, TextResourceContents):
            joined += content.text.encode()
        else:
            assert isinstance(content, BlobResourceContents)
            joined += base64.b64decode(content.blob)
    assert len(joined) == link["size_bytes"] and hashlib.sha256(joined).hexdigest() == link["sha256"]
    return joined


async def refused(client: Client, uri: str) -> MCPError:
    with pytest.raises(MCPError) as caught:
        await client.read_resource(uri)
    assert caught.value.code == -32602
    return caught.value


async def test_a_text_file_comes_back_as_a_link_and_reads_back_whole_across_parts(rig: Any) -> None:
    _, client = rig
    for chunked in (True, False):
        done = await finished(client, "essay", chunked=chunked)
        link = done["result_link"]
        assert done["result"] == link  # a ResultFile job's declared result is its link
        assert link["parts"] == 3 and link["summary"] == "An essay." and link["name"] == "essay.txt"
        assert link["uri"] in done["next"] and "parts/0" in done["next"]
        assert "its result is a file, " in done["next"] and "too large" not in done["next"]
        assert len(json.dumps(done)) < 3_000  # bounded metadata, never the payload
        assert (await read_all(client.client, link)).decode() == TEXT
        whole = await refused(client.client, link["uri"])
        assert "3 parts" in whole.message and f"{link['uri']}/parts/0" in whole.message
        await refused(client.client, f"{link['uri']}/parts/3")


async def test_a_binary_file_is_read_as_base64_parts(rig: Any) -> None:
    _, client = rig
    link = (await finished(client, "picture"))["result_link"]
    assert link["media_type"] == "image/x-test" and link["parts"] == 2
    assert await read_all(client.client, link) == BLOB


async def test_a_structured_result_past_its_threshold_is_linked_as_json(rig: Any) -> None:
    _, client = rig
    small = await finished(client, "table", count=5)
    assert small["result"]["rows"][4] == {"id": 4, "name": "row 4"} and small.get("result_link") is None
    large = await finished(client, "table", count=500)
    assert large["result"] is None
    link = large["result_link"]
    assert link["media_type"] == "application/json" and link["parts"] == 1
    assert f"its result is {link['size_bytes']} bytes of application/json" in large["next"]
    assert "too large to show here" in large["next"]
    assert json.loads(await read_all(client.client, link))["rows"][499] == {"id": 499, "name": "row 499"}


async def test_the_plain_call_answers_the_link_with_a_resource_link_item(rig: Any) -> None:
    _, client = rig
    result = await client.client.call_tool("tiny", {})
    sentence, item = result.content
    assert isinstance(sentence, TextContent) and isinstance(item, ResourceLink)
    assert item.mime_type == "text/csv" and item.size == 8 and item.uri in sentence.text
    # A file the job returns is a file whatever its size: never called too large to show.
    assert (
        sentence.text.startswith("The result is a file, 8 bytes of text/csv")
        and "too large" not in sentence.text
    )
    read = await client.client.read_resource(item.uri)
    (content,) = read.contents
    assert isinstance(content, TextResourceContents) and content.text == "a,b\n1,2\n"


async def test_a_file_past_the_size_limit_fails_the_job_and_leaves_no_parts(
    tmp_path: Path, signing_key: str, database_url: str
) -> None:
    config = handles_config(
        tmp_path / "data", [signing_key], database_url=database_url, max_result_file_bytes=PART_BYTES
    )
    jobs = Handles(config)
    declare(jobs)
    server: MCPServer[Any] = MCPServer("links")
    jobs.bind(server)
    try:
        async with connect(server) as client:
            started = await client.call("essay_start", {})
            done = await client.call("essay_fetch", {"handle": started["handle"], "wait_seconds": 30})
            assert done["status"] == "failed" and done["error"]["data"]["reason"] == "result_too_large"
            assert str(PART_BYTES) in done["error"]["message"]
        with jobs.service.store.repo.engine.connect() as connection:  # the part written is gone
            assert connection.execute(text("SELECT count(*) FROM handles_result_parts")).scalar() == 0
    finally:
        await jobs.aclose()


async def test_links_are_made_up_foreign_or_gone_alike_and_parts_go_with_the_job(rig: Any) -> None:
    jobs, client = rig
    link = (await finished(client, "tiny"))["result_link"]
    job_id, file_id = link["uri"].split("/")[-2:]
    made_up = [
        "handles://results/nothing-here/" + "0" * 32,
        link["uri"].replace(file_id, "f" * 32),
        link["uri"] + "/parts/1",
        "handles://results/../../etc/passwd",
        "handles://elsewhere",
    ]
    answers = {(await refused(client.client, uri)).message.replace(uri, "<uri>") for uri in made_up}
    assert len(answers) == 1, answers  # one answer, whatever is wrong with the link

    # Another principal's server view: the same job read by a different principal looks made up.
    repo = jobs.service.store.repo
    with repo.engine.begin() as connection:
        connection.execute(
            text("UPDATE handles_jobs SET principal = 'local:mallory' WHERE id = :id"), {"id": job_id}
        )
    foreign = await refused(client.client, link["uri"])
    assert foreign.message.replace(link["uri"], "<uri>") in answers
    with repo.engine.begin() as connection:
        connection.execute(
            text("UPDATE handles_jobs SET principal = 'local:local' WHERE id = :id"), {"id": job_id}
        )
    assert (await client.client.read_resource(link["uri"])).contents

    # The end of retention: the job and every part of its file are deleted together.
    past = datetime.now(UTC) - timedelta(seconds=1)
    with repo.engine.begin() as connection:
        connection.execute(
            text("UPDATE handles_jobs SET expires_at = :t WHERE id = :id"), {"t": past, "id": job_id}
        )
    await refused(client.client, link["uri"])
    repo.delete_expired(100)  # the node's own sweep may have deleted it first
    with repo.engine.begin() as connection:
        left = [
            connection.execute(
                text(f"SELECT count(*) FROM {table} WHERE {key} = :id"), {"id": job_id}
            ).scalar()
            for table, key in (("handles_jobs", "id"), ("handles_result_parts", "job_id"))
        ]
    assert left == [0, 0]


async def test_follow_returns_the_link_on_either_face_and_read_link_streams_it(
    rig: Any, tmp_path: Path
) -> None:
    _, client = rig
    journal = Journal(tmp_path / "journal.db")
    async with Client(client.server, extensions=[TasksClientExtension()]) as tasks_client:
        for prefer in ("tasks", "handles"):
            essay = await follow(
                tasks_client, "essay", {}, key=f"essay-{prefer}", journal=journal, prefer=prefer
            )
            chunks = [chunk async for chunk in read_link(tasks_client, essay)]
            assert len(chunks) == 3 and b"".join(chunks).decode() == TEXT
            table = await follow(
                tasks_client, "table", {"count": 300}, key=f"table-{prefer}", journal=journal, prefer=prefer
            )
            assert table["media_type"] == "application/json"  # the link, on either face
            rows = json.loads(b"".join([chunk async for chunk in read_link(tasks_client, table)]))
            assert rows["rows"][299]["id"] == 299
        with pytest.raises(
            LinkReadError, match="read it again"
        ):  # bytes that are not what the link describes
            async for _ in read_link(tasks_client, {**table, "sha256": "0" * 64}):
                pass
