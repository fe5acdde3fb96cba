"""/proc/modules -> loaded kernel modules (name, size, users, state).

Line format (proc(5), kernel/module/procfs.c m_show): ``name size refcount deps state
address``, e.g. ``nouveau 2801664 1 - Live 0x0000000000000000``. A kernel built without
CONFIG_MODULE_UNLOAD prints ``- -`` for refcount and deps (print_unload_info), e.g.
``nvidia 14299136 - - Live 0xffffffffc0400000 (O)``: the refcount is then unknown (None).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TypedDict

from gpuserve.parsers.common import ParseError, as_lines

_LINE_RE = re.compile(
    r"^(?P<name>\w+) (?P<size>\d+) (?P<refs>-?\d+|-) (?P<deps>\S+) "
    r"(?P<state>Live|Loading|Unloading)"
    r"(?: 0x[0-9a-f]+)?(?: \(.*\))?\s*$"
)


class Module(TypedDict):
    size: int
    refcount: int | None
    used_by: list[str]
    state: str


def parse_proc_modules(text: str | Iterable[str]) -> dict[str, Module]:
    """Parse /proc/modules into name -> module info."""
    modules: dict[str, Module] = {}
    for line_no, line in enumerate(as_lines(text), start=1):
        if not line.strip():
            continue
        match = _LINE_RE.match(line)
        if not match:
            raise ParseError("not a /proc/modules line", line_no, line)
        deps = match.group("deps")
        modules[match.group("name")] = {
            "size": int(match.group("size")),
            "refcount": None if match.group("refs") == "-" else int(match.group("refs")),
            "used_by": [d for d in deps.split(",") if d and d != "-"],
            "state": match.group("state"),
        }
    return modules
