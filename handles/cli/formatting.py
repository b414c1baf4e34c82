"""How the `handles` commands print: tables, clipped and one-line text, timestamps."""

from __future__ import annotations

from datetime import datetime


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def _clip(text: str, width: int) -> str:
    """`text` within `width` characters, ending in `...` when cut (ASCII: any terminal encoding shows it)."""
    if len(text) <= width:
        return text
    return text[: width - 3] + "..." if width > 3 else text[:width]


def _table(rows: list[list[str]], headers: list[str]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def _one_line(text: str) -> str:
    """`text` on one line with nothing a terminal would interpret (newlines, escapes) left in it."""
    return "".join(c if c.isprintable() else " " for c in text)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
