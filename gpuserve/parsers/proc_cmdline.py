"""/proc/cmdline -> the raw command line and its parameters.

The kernel splits parameters on spaces, honouring double quotes
(https://docs.kernel.org/admin-guide/kernel-parameters.html); a later ``key=value``
overrides an earlier one for most parameters, so the dict keeps the last value.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from typing import TypedDict

from gpuserve.parsers.common import ParseError, as_lines


class Cmdline(TypedDict):
    raw: str
    args: dict[str, str | None]


def parse_cmdline(text: str | Iterable[str]) -> Cmdline:
    """Parse /proc/cmdline (a single line); a bare flag such as ``quiet`` maps to None."""
    lines = [line for line in as_lines(text) if line.strip()]
    if len(lines) != 1:
        raise ParseError(f"/proc/cmdline has one line, got {len(lines)}")
    raw = lines[0].strip()
    if not raw.isprintable():
        raise ParseError("control characters in a kernel command line", 1, lines[0])
    try:
        tokens = shlex.split(raw)
    except ValueError as exc:
        raise ParseError(f"unbalanced quotes ({exc})", 1, lines[0]) from exc
    args: dict[str, str | None] = {}
    for token in tokens:
        key, sep, value = token.partition("=")
        args[key] = value if sep else None
    return {"raw": raw, "args": args}
