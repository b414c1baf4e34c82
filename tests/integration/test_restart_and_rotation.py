"""State outlives the process, and signing keys rotate: the example server restarted on the same SQLite file.

Over stdio each `connect` starts a new server process; over HTTP the subprocess is
stopped and started again on the same data directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from handles.handle import HandleCodec
from tests.support import (
    LOCAL_PRINCIPAL,
    HttpExampleServer,
    ToolClient,
    connect,
    example_env,
    new_key,
    stdio_params,
)


async def run_report(client: ToolClient) -> tuple[str, dict[str, Any]]:
    started = await client.call("generate_report_start", {"account": "restart", "months": 2})
    handle = str(started["handle"])
    done = await client.call("generate_report_fetch", {"handle": handle, "wait_seconds": 20})
    assert done["status"] == "completed" and done["result"] is not None
    return handle, done.data


async def refused_like_made_up(client: ToolClient, handle: str) -> None:
    reply = await client.call("generate_report_fetch", {"handle": handle})
    made_up = await client.call("generate_report_fetch", {"handle": "not-a-real-handle"})
    assert reply.is_error and reply["error"] == "unknown_handle"
    assert reply.text == made_up.text


async def test_stdio_restart_keeps_results_and_keys_rotate(tmp_path: Path) -> None:
    old_key, new_key_ = new_key(), new_key()
    data = tmp_path / "data"

    async with connect(stdio_params(example_env(data, [old_key])), forbidden=[old_key]) as first:
        old_handle, result = await run_report(first)

    # Restarted with a new signing key in front: the old key still verifies, the new one signs.
    rotated = stdio_params(example_env(data, [new_key_, old_key]))
    async with connect(rotated, forbidden=[old_key, new_key_]) as second:
        again = await second.call("generate_report_fetch", {"handle": old_handle})
        assert not again.is_error
        assert again["result"] == result["result"], "the result survived the restart"
        progress = await second.call("generate_report_progress", {"handle": old_handle, "wait_seconds": 5})
        assert progress["status"] == "completed" and progress["attempts"] == 1, "it did not run again"
        new_handle, _ = await run_report(second)
    assert HandleCodec([new_key_]).verify(new_handle, principal=LOCAL_PRINCIPAL) is not None
    assert HandleCodec([old_key]).verify(new_handle, principal=LOCAL_PRINCIPAL) is None

    # The old key retired: its handles are refused exactly like made-up ones; the new key's still work.
    async with connect(stdio_params(example_env(data, [new_key_])), forbidden=[old_key, new_key_]) as third:
        await refused_like_made_up(third, old_handle)
        still = await third.call("generate_report_fetch", {"handle": new_handle})
        assert not still.is_error and still["status"] == "completed"


async def test_http_restart_keeps_results_and_retired_keys_stop_verifying(tmp_path: Path) -> None:
    old_key, new_key_ = new_key(), new_key()
    server = HttpExampleServer(tmp_path / "data", [old_key]).start()
    try:
        async with connect(server.url, forbidden=[old_key]) as client:
            handle, result = await run_report(client)
            unfinished = str((await client.call("export_dataset_start", {"rows": 5}))["handle"])

        # Restarted on the same file, with a new key in front of the old one.
        server.restart(keys=[new_key_, old_key])
        async with connect(server.url, forbidden=[old_key, new_key_]) as client:
            again = await client.call("generate_report_fetch", {"handle": handle})
            assert not again.is_error and again["result"] == result["result"]
            # A job interrupted by the stop ended (export_dataset fails on interruption) or had finished:
            # either way it is settled and reachable, never stuck `working`.
            settled = await client.call("export_dataset_fetch", {"handle": unfinished, "wait_seconds": 20})
            assert settled["status"] in ("completed", "failed"), settled.data
            if settled["status"] == "failed":
                assert settled.is_error and "interrupted" in settled["error"]["message"]

        server.restart(keys=[new_key_])
        async with connect(server.url, forbidden=[old_key, new_key_]) as client:
            await refused_like_made_up(client, handle)
    finally:
        server.stop()
