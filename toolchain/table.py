"""The terminal tables (verify's checks, the toolchain, a release's entries): every
column but the last padded to its widest cell, two spaces between columns."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["aligned"]


def aligned(rows: Sequence[Sequence[str]], *, rule: bool = False) -> list[str]:
    """The rows as lines; `rule`: a line of dashes under the first row (the header)."""
    if not rows:
        return []
    columns = max(len(r) for r in rows)
    widths = [max((len(r[i]) for r in rows if i < len(r)), default=0) for i in range(columns - 1)]
    lines = ["  ".join([*(f"{cell:<{widths[i]}}" for i, cell in enumerate(r[:-1])), r[-1]]).rstrip() for r in rows]
    if rule:
        lines.insert(1, "-" * min(100, max(len(line) for line in lines)))
    return lines
