"""IOMMU groups from sysfs, and whether the IOMMU is on.

``find /sys/kernel/iommu_groups -type l`` lists one symlink per device:
``/sys/kernel/iommu_groups/<group>/devices/<domain:bus:dev.fn>``
(https://docs.kernel.org/driver-api/vfio.html, "Groups, Devices, and IOMMUs").
The directory exists but stays empty when no IOMMU is active, so an empty listing
is evidence that the IOMMU is off.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Literal, TypedDict

from gpuserve.parsers.common import ParseError, as_lines

_LINK_RE = re.compile(
    r"^/sys/kernel/iommu_groups/(\d+)/devices/([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])$"
)


class IommuGroup(TypedDict):
    group: int
    devices: list[str]


def parse_iommu_groups(text: str | Iterable[str]) -> list[IommuGroup]:
    """Group the device links by group number (sorted by group, then device)."""
    groups: dict[int, list[str]] = {}
    for line_no, line in enumerate(as_lines(text), start=1):
        if not line.strip():
            continue
        match = _LINK_RE.match(line.strip())
        if not match:
            raise ParseError("not an iommu_groups device link", line_no, line)
        groups.setdefault(int(match.group(1)), []).append(match.group(2))
    return [{"group": g, "devices": sorted(devs)} for g, devs in sorted(groups.items())]


# Parameters that turn the IOMMU off (kernel-parameters.html: intel_iommu=off,
# amd_iommu=off, iommu=off).
_OFF_PARAMS = ("intel_iommu", "amd_iommu", "iommu")


def iommu_state(
    groups: list[IommuGroup] | None, cmdline_args: Mapping[str, str | None] | None = None
) -> Literal["on", "off"] | None:
    """"on" when any IOMMU group exists; "off" when none does or the command line
    turns it off; None when the groups could not be listed.

    Groups are the evidence that DMA remapping is active (iommu=pt still creates
    groups); the command line alone is not, because IOMMU defaults differ by vendor
    and kernel version (AMD on by default, Intel from Linux 6.8 with
    CONFIG_INTEL_IOMMU_DEFAULT_ON).
    """
    if groups:
        return "on"
    if cmdline_args and any(cmdline_args.get(p) == "off" for p in _OFF_PARAMS):
        return "off"
    if groups is None:
        return None
    return "off"
