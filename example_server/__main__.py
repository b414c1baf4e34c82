"""Run the example server: `python -m example_server` (stdio) or `--http --port N [--tokens FILE]`,
with `--layout compact` for the shared follow tools."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings

from example_server.server import build_server, create_jobs
from handles.errors import ConfigurationError
from handles.layout import LAYOUTS
from handles.mcp import serve_http, serve_stdio


class FileTokenVerifier:
    """Bearer tokens from a JSON file {token: principal}; for the example and tests, not production."""

    def __init__(self, tokens: dict[str, str]) -> None:
        self._tokens = tokens

    async def verify_token(self, token: str) -> AccessToken | None:
        principal = self._tokens.get(token)
        if principal is None:
            return None
        return AccessToken(token=token, client_id=principal, subject=principal, scopes=[])


def main(argv: list[str] | None = None) -> None:
    """Serve, or exit 2 with one line on stderr saying what to fix (a key, the database, the schema)."""
    try:
        serve(argv)
    except ConfigurationError as exc:
        print(f"example_server: {exc}", file=sys.stderr)
        sys.exit(2)


def serve(argv: list[str] | None) -> None:
    parser = argparse.ArgumentParser(prog="python -m example_server", description=__doc__)
    parser.add_argument(
        "--http", action="store_true", help="serve stateless Streamable HTTP instead of stdio"
    )
    parser.add_argument("--port", type=int, default=8000, help="HTTP port on 127.0.0.1 (default 8000)")
    parser.add_argument("--tokens", type=Path, help="JSON file {token: principal}; requires bearer tokens")
    parser.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="per_job",
        help="per_job: <job>_progress/_fetch/_cancel/_respond per job (default); "
        "compact: one shared jobs_progress/_fetch/_cancel/_respond",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )

    jobs = create_jobs()
    if not args.http:
        asyncio.run(serve_stdio(build_server(jobs, layout=args.layout), jobs))
        return

    options: dict[str, Any] = {}
    if args.tokens:
        tokens = json.loads(args.tokens.read_text())
        base = f"http://127.0.0.1:{args.port}"
        options["token_verifier"] = FileTokenVerifier(tokens)
        options["auth"] = AuthSettings(
            issuer_url=base, resource_server_url=f"{base}/mcp", validate_token_resource=False
        )
    server = build_server(jobs, layout=args.layout, **options)
    asyncio.run(serve_http(server, jobs, host="127.0.0.1", port=args.port))


if __name__ == "__main__":
    main()
