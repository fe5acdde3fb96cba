"""``systemd-detect-virt``: the virtualization technology, or "none" on bare metal.

It prints one identifier ("kvm", "qemu", "microsoft", "lxc", ... or "none") and exits
non-zero for "none" (systemd-detect-virt(1)); the fact wraps the exit status.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gpuserve.parsers.common import ParseError, as_lines

_ID_RE = re.compile(r"^[a-z][a-z0-9_-]*$")


def parse_detect_virt(text: str | Iterable[str]) -> str:
    """Return the identifier systemd-detect-virt printed ("none" on bare metal)."""
    lines = [(n, line) for n, line in enumerate(as_lines(text), start=1) if line.strip()]
    if len(lines) != 1:
        raise ParseError(f"expected one identifier, got {len(lines)} lines")
    line_no, line = lines[0]
    value = line.strip()
    if not _ID_RE.match(value):
        raise ParseError("not a virtualization identifier", line_no, line)
    return value
