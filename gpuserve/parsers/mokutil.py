"""``mokutil --sb-state`` -> Secure Boot on (True) or off (False).

mokutil prints "SecureBoot enabled" / "SecureBoot disabled"; on a legacy-BIOS boot it
prints "EFI variables are not supported on this system" (and exits 1), where Secure
Boot cannot be on (mokutil.c, lcp/mokutil on GitHub).
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuserve.parsers.common import ParseError, as_lines

_NOT_EFI = (
    "EFI variables are not supported on this system",
    "This system doesn't support Secure Boot",
)


def parse_sb_state(text: str | Iterable[str]) -> bool:
    """True if Secure Boot is enabled, False if disabled or the boot is not EFI."""
    lines = as_lines(text)
    for line in lines:
        value = line.strip()
        if value == "SecureBoot enabled":
            return True
        if value == "SecureBoot disabled":
            return False
        if any(value.startswith(marker) for marker in _NOT_EFI):
            return False
    first = next(((n, line) for n, line in enumerate(lines, 1) if line.strip()), None)
    if first is None:
        raise ParseError("empty mokutil output")
    raise ParseError("no 'SecureBoot enabled/disabled' line", *first)
