"""A 50 MB export over Streamable HTTP: the reply stays small, the link is read in parts, memory stays bounded.

The example server runs as a subprocess with bearer tokens; `export_dataset` returns its CSV as a
`ResultFile`. Alice reads her export part by part with the official client; Bob, holding the same
link, gets exactly the answer a made-up link gets. The server's peak resident memory (`VmHWM`)
grows by far less than the file.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import httpx2
from mcp.shared.exceptions import MCPError
from mcp_types import ResourceLink, TextContent, TextResourceContents

from example_server.server import csv_rows
from tests.support import TOKENS, HttpExampleServer, connect, token_of

ROWS = 1_500_000  # about 50 MB of CSV


def peak_memory_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc status")


async def test_a_50_mb_export_is_a_small_reply_and_a_link_read_in_parts(
    tmp_path: Path, signing_key: str
) -> None:
    expected = hashlib.sha256()
    size = 0
    for block in csv_rows(ROWS):
        data = block.encode()
        expected.update(data)
        size += len(data)
    assert size > 50_000_000

    server = HttpExampleServer(tmp_path / "data", [signing_key], TOKENS).start()
    try:
        assert server.process is not None
        async with connect(server.url, token=token_of("alice"), forbidden=[signing_key, *TOKENS]) as alice:
            await alice.call("lookup_account", {"account": "acme"})  # the server is up and has served a call
            at_start = peak_memory_kib(server.process.pid)
            started = await alice.call("export_dataset_start", {"rows": ROWS})
            done = await alice.call("export_dataset_fetch", {"handle": started["handle"], "wait_seconds": 50})
            assert done["status"] == "completed", done.data
            assert len(json.dumps(done.data)) < 3_000  # the reply carries metadata, not 50 MB
            link = done["result_link"]
            assert link["media_type"] == "text/csv" and link["size_bytes"] == size
            assert link["sha256"] == expected.hexdigest() and link["parts"] == -(-size // (1024 * 1024))

            # The plain call's answer (what a Tasks client gets too) links the same way.
            plain = await alice.client.call_tool("export_dataset", {"rows": 10})
            assert isinstance(plain.content[0], TextContent) and isinstance(plain.content[1], ResourceLink)

            written_mib = (peak_memory_kib(server.process.pid) - at_start) / 1024
            assert written_mib < 25, (
                f"the server's peak memory grew by {written_mib:.0f} MiB writing a 50 MB file"
            )
            before = peak_memory_kib(server.process.pid)
            joined = hashlib.sha256()
            read = 0
            for part in range(link["parts"]):
                contents = (await alice.client.read_resource(f"{link['uri']}/parts/{part}")).contents
                assert len(contents) == 1 and isinstance(contents[0], TextResourceContents)
                data = contents[0].text.encode()
                joined.update(data)
                read += len(data)
            assert read == size and joined.hexdigest() == expected.hexdigest()
            grown_mib = (peak_memory_kib(server.process.pid) - before) / 1024
            print(f"peak memory growth: writing {written_mib:.1f} MiB, reading {grown_mib:.1f} MiB")
            assert grown_mib < 25, (
                f"the server's peak memory grew by {grown_mib:.0f} MiB reading a 50 MB file"
            )

        first_part = f"{link['uri']}/parts/0"
        made_up = first_part.replace(link["uri"].split("/")[-1], "0" * 32)
        async with connect(server.url, token=token_of("bob")) as bob:
            answers = []
            for uri in (first_part, made_up):
                try:
                    await bob.client.read_resource(uri)
                except MCPError as error:
                    answers.append((error.code, error.message.replace(uri, "<uri>")))
            assert len(answers) == 2 and answers[0] == answers[1]
        async with httpx2.AsyncClient() as http:  # no token at all: the server refuses before any lookup
            response = await http.post(
                server.url, json={"jsonrpc": "2.0", "id": 1, "method": "resources/read"}
            )
            assert response.status_code == 401
    finally:
        server.stop()
