"""Which boot loader a host uses (GRUB or systemd-boot), from gathered evidence.

Why: the kernel command line lives in /etc/kernel/cmdline for systemd-boot and in
/etc/default/grub for GRUB, so the host role must know which one to edit. The fact
(gpuserve.facts.host.BootLoader) prints ``key: value`` evidence lines; this judges them.

How: docs/deploys.md, "gpuserve.parsers.bootloader: evidence lines and sources"
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

from gpuserve.parsers.common import ParseError, as_lines

BootLoaderName = Literal["grub", "systemd-boot"]
_KEYS = ("pbt", "loaderinfo", "grub_cfg", "efi")
_PBT_RE = re.compile(r"is configured with: ([a-z,]+)")


def parse_boot_evidence(text: str | Iterable[str]) -> BootLoaderName | None:
    """Decide the boot loader; proxmox-boot-tool's view wins, then LoaderInfo, then
    grub.cfg. None when there is no evidence (e.g. a VM booted by direct kernel boot)."""
    configured: set[str] = set()
    seen: set[str] = set()
    for line_no, line in enumerate(as_lines(text), start=1):
        if not line.strip():
            continue
        key, sep, value = line.partition(": ")
        if not sep or key not in _KEYS:
            raise ParseError("expected '<evidence>: <value>'", line_no, line)
        seen.add(key)
        if key == "pbt" and (match := _PBT_RE.search(value)):
            configured.update(match.group(1).split(","))
    if configured == {"uefi"}:
        return "systemd-boot"
    if configured == {"grub"}:
        return "grub"
    if "loaderinfo" in seen:
        return "systemd-boot"
    if "grub_cfg" in seen:
        return "grub"
    return None
