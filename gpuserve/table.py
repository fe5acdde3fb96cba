"""The one fixed-width table the commands and bench scripts print.

``gpuserve compare``, ``gpuserve fleet status``, the tuner's report, ``gpuserve plan``'s
figures and bench/locks.py each padded their own columns; this is their one printer.
The cells are text already (escaped by the caller where they come from a host or a
record: gpuserve.terminal.printable).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence


def table(rows: Sequence[Sequence[str]], *, right: Collection[int] = (), rule: bool = True,
          free_last: bool = False, indent: str = "") -> list[str]:
    """``rows`` (the first one the header when ``rule``) as lines: columns two spaces
    apart, padded to their widest cell, the ``right`` ones (by index) right-aligned,
    trailing spaces stripped; with ``rule`` a line of dashes under the header. With
    ``free_last`` the last column is not padded (a free-text "why" column) and nothing
    is stripped."""
    columns = len(rows[0]) if rows else 0
    padded = columns - 1 if free_last else columns
    widths = [max(len(row[i]) for row in rows) for i in range(padded)]

    def cell(i: int, text: str) -> str:
        if i >= padded:
            return text
        return text.rjust(widths[i]) if i in right else text.ljust(widths[i])

    lines = [indent + "  ".join(cell(i, text) for i, text in enumerate(row)) for row in rows]
    if not free_last:
        lines = [line.rstrip() for line in lines]
    if rule and lines:
        lines.insert(1, indent + "  ".join("-" * w for w in widths))
    return lines
