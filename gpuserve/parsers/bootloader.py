"""Which boot loader a host uses (GRUB or systemd-boot), from gathered evidence.

The fact prints ``key: value`` evidence lines (see gpuserve.facts.host.BootLoader):

- ``pbt: <line>``: ``proxmox-boot-tool status`` output. Its status() prints, per ESP,
  ``<UUID> is configured with: uefi|grub|uefi,grub (versions: ...)``, where "uefi"
  means systemd-boot (proxmox/proxmox-kernel-helper, src/bin/proxmox-boot-tool; Proxmox
  VE admin guide, "Host Bootloader": ZFS-root EFI installs use systemd-boot unless
  Secure Boot is on, all others GRUB).
- ``loaderinfo: yes``: the LoaderInfo EFI variable exists, which systemd-boot sets
  (Boot Loader Interface, https://systemd.io/BOOT_LOADER_INTERFACE/).
- ``grub_cfg: yes``: /boot/grub/grub.cfg exists.
- ``efi: yes``: booted via UEFI (/sys/firmware/efi exists).

The kernel command line lives in /etc/kernel/cmdline for systemd-boot and in
/etc/default/grub for GRUB, which is why the host role needs this.
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
