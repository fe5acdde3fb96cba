"""/proc/cpuinfo -> CPU vendor ("intel", "amd", or the raw vendor_id).

x86 kernels print ``vendor_id\t: GenuineIntel`` / ``AuthenticAMD`` per CPU
(arch/x86/kernel/cpu/proc.c). The vendor matters for IOMMU defaults and NCCL's P2P
level on AMD hosts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gpuserve.parsers.common import ParseError, as_lines

_VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd", "HygonGenuine": "hygon"}
_LINE_RE = re.compile(r"^vendor_id\s*:\s*(\S+)\s*$")


def parse_cpu_vendor(text: str | Iterable[str]) -> str | None:
    """Vendor of the first CPU; None when there is no vendor_id line (e.g. arm64)."""
    for line_no, line in enumerate(as_lines(text), start=1):
        if line.startswith("vendor_id"):
            match = _LINE_RE.match(line)
            if not match:
                raise ParseError("bad vendor_id line", line_no, line)
            return _VENDORS.get(match.group(1), match.group(1))
    return None
