"""The `handles` command for operators (`handles --help`); `main` is the console script's entry point."""

from __future__ import annotations

import logging
import re
import sys

from handles.cli.parser import build_parser
from handles.errors import ConfigurationError

_DASHED_ID = re.compile(r"^-[A-Za-z0-9_-]{16,64}$")
"""A job id that begins with `-` (ids stored before they were drawn without one): never an option here."""


def accept_dashed_ids(argv: list[str]) -> list[str]:
    """`argv` with a job id that begins with `-` passed as the value it is, not read as an option."""
    if "--" in argv:
        return argv
    dashed = [index for index, token in enumerate(argv) if _DASHED_ID.match(token)]
    if len(dashed) != 1:
        return argv
    index = dashed[0]
    if index > 0 and argv[index - 1] == "--job":
        return [*argv[: index - 1], f"{argv[index - 1]}={argv[index]}", *argv[index + 1 :]]
    return [*argv[:index], *argv[index + 1 :], "--", argv[index]]


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for chatty in ("alembic", "httpx2"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    args = build_parser().parse_args(accept_dashed_ids(sys.argv[1:] if argv is None else argv))
    try:
        code: int = args.run(args)
    except ConfigurationError as exc:
        print(f"handles: {exc}", file=sys.stderr)
        return 2
    return code
