"""A node bound to a loopback address refuses requests that a web page on another site makes through the
user's browser (DNS rebinding): a foreign `Host` or `Origin` never reaches the jobs, on either framework."""

from __future__ import annotations

from pathlib import Path

import httpx2 as httpx
import pytest

from example_server.server import build_fastmcp_server, build_server, create_jobs
from handles.testing import served
from tests.durability.harness import config

pytestmark = pytest.mark.timeout(60)

LIST_TOOLS = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.mark.parametrize("framework", ["mcpserver", "fastmcp"])
def test_a_foreign_host_or_origin_is_refused_and_a_local_one_served(framework: str, tmp_path: Path) -> None:
    jobs = create_jobs(config(tmp_path))
    server = build_fastmcp_server(jobs) if framework == "fastmcp" else build_server(jobs)
    with served(server, jobs) as url, httpx.Client(timeout=10) as client:
        port = url.split(":")[2].split("/")[0]
        local = client.post(url, json=LIST_TOOLS, headers=HEADERS)
        assert local.status_code == 200, local.text
        foreign_origin = client.post(
            url, json=LIST_TOOLS, headers={**HEADERS, "Origin": "http://evil.example"}
        )
        assert foreign_origin.status_code == 403, (foreign_origin.status_code, foreign_origin.text)
        foreign_host = client.post(url, json=LIST_TOOLS, headers={**HEADERS, "Host": f"evil.example:{port}"})
        assert foreign_host.status_code in (400, 421), (foreign_host.status_code, foreign_host.text)
        same_site = client.post(
            url, json=LIST_TOOLS, headers={**HEADERS, "Origin": f"http://127.0.0.1:{port}"}
        )
        assert same_site.status_code == 200, same_site.text
