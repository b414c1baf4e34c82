"""Run the example server: `python -m example_server` (stdio) or `--http --port N [--tokens FILE]`,
with `--layout compact` for the shared follow tools, and `--fastmcp` to serve the same jobs from a
FastMCP 4 server instead of the SDK's `MCPServer` (`pip install 'mcp-handles[fastmcp]'`)."""

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

from example_server.server import build_fastmcp_server, build_server, create_jobs
from handles import serve_http, serve_stdio
from handles.errors import ConfigurationError
from handles.tool_layout import LAYOUTS


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
    parser.add_argument(
        "--fastmcp",
        action="store_true",
        help="serve the same jobs from a FastMCP 4 server (needs mcp-handles[fastmcp])",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )

    jobs = create_jobs()
    if args.fastmcp:
        serve_fastmcp(jobs, args)
        return
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


def serve_fastmcp(jobs: Any, args: argparse.Namespace) -> None:
    """The same example on FastMCP 4, with the same options; tokens through a FastMCP `TokenVerifier`."""
    try:
        from fastmcp.server.auth import AccessToken as FastMCPAccessToken
        from fastmcp.server.auth import TokenVerifier
    except ImportError:
        raise ConfigurationError("--fastmcp needs FastMCP 4: pip install 'mcp-handles[fastmcp]'") from None

    class FastMCPFileTokens(TokenVerifier):
        """The same JSON token file, verified by FastMCP's authentication."""

        def __init__(self, tokens: dict[str, str], base_url: str) -> None:
            super().__init__(base_url=base_url)
            self._tokens = tokens

        async def verify_token(self, token: str) -> FastMCPAccessToken | None:
            principal = self._tokens.get(token)
            if principal is None:
                return None
            return FastMCPAccessToken(token=token, client_id=principal, subject=principal, scopes=[])

    if not args.http:
        asyncio.run(serve_stdio(build_fastmcp_server(jobs, layout=args.layout), jobs))
        return
    auth = None
    if args.tokens:
        auth = FastMCPFileTokens(json.loads(args.tokens.read_text()), f"http://127.0.0.1:{args.port}")
    server = build_fastmcp_server(jobs, layout=args.layout, auth=auth)
    asyncio.run(serve_http(server, jobs, host="127.0.0.1", port=args.port))


if __name__ == "__main__":
    main()
