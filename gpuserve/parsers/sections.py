"""Split the output of a multi-command script into named sections.

Gathering many facts in one shell script (one SSH round trip) needs a way to tell the
commands' outputs apart: each command is preceded by a marker line that no tool prints.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gpuserve.parsers.common import as_lines

MARKER_PREFIX = "##gpuserve-section:"
_MARKER_RE = re.compile(r"^##gpuserve-section:([a-z0-9_]+)##$")


def marker(name: str) -> str:
    """The marker line that opens section ``name``."""
    if not re.fullmatch(r"[a-z0-9_]+", name):
        raise ValueError(f"bad section name {name!r}")
    return f"{MARKER_PREFIX}{name}##"


def split_sections(text: str | Iterable[str]) -> dict[str, list[str]]:
    """Map each section name to its lines; lines before the first marker are dropped."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in as_lines(text):
        match = _MARKER_RE.match(line.strip())
        if match:
            current = sections.setdefault(match.group(1), [])
        elif current is not None:
            current.append(line)
    return sections
