"""``lspci -vvv`` -> PCI bridges and their Access Control Services (ACS) state.

ACS on a bridge with SrcValid/ReqRedir/CmpltRedir set in ACSCtl redirects peer-to-peer
TLPs up to the root complex, which breaks or slows GPU P2P (NCCL troubleshooting,
"PCI Access Control Services (ACS)":
https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html).
lspci prints the capability as (pciutils ls-ecaps.c, cap_acs)::

    Capabilities: [148 v1] Access Control Services
        ACSCap: SrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-
        ACSCtl: SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-

Without root, lspci prints ``Capabilities: <access denied>`` and ACS is unknown.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TypedDict

from gpuserve.parsers.common import ParseError, as_lines

# "00:01.0 PCI bridge: ..." or with -D "0000:00:01.0 PCI bridge: ..."
_DEVICE_RE = re.compile(
    r"^(?P<bdf>(?:[0-9a-f]{4,8}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) (?P<cls>[^:]+): (?P<desc>.*)$"
)
_FLAGS_RE = re.compile(r"^\s+(ACSCap|ACSCtl):\s+(.*)$")
_FLAG_RE = re.compile(r"^([A-Za-z]+)([+-])$")
# The ACSCtl bits that redirect peer traffic upstream.
REDIRECT_FLAGS = ("SrcValid", "ReqRedir", "CmpltRedir")


class AcsBridge(TypedDict):
    bdf: str
    description: str
    acs: bool | None  # has the ACS capability; None when lspci could not read caps
    acs_cap: dict[str, bool]
    acs_ctl: dict[str, bool]
    redirect: bool | None  # any of REDIRECT_FLAGS enabled in ACSCtl


def _flags(text: str, line_no: int, line: str) -> dict[str, bool]:
    flags: dict[str, bool] = {}
    for token in text.split():
        match = _FLAG_RE.match(token)
        if not match:
            raise ParseError(f"bad ACS flag {token!r}", line_no, line)
        flags[match.group(1)] = match.group(2) == "+"
    return flags


def parse_lspci_acs(text: str | Iterable[str], bridges_only: bool = True) -> list[AcsBridge]:
    """Every PCI-to-PCI bridge (or every device with ``bridges_only=False``) with its ACS
    state."""
    devices: list[AcsBridge] = []
    classes: list[str] = []
    current: AcsBridge | None = None
    denied = False
    for line_no, line in enumerate(as_lines(text), start=1):
        if not line.strip():
            continue
        if not line[0].isspace():
            match = _DEVICE_RE.match(line)
            if not match:
                raise ParseError("expected a device line ('<bus:dev.fn> <class>: ...')", line_no,
                                 line)
            if current is not None and denied and not current["acs"]:
                current["acs"] = None
            current = {
                "bdf": match.group("bdf"),
                "description": f"{match.group('cls')}: {match.group('desc')}",
                "acs": False,
                "acs_cap": {},
                "acs_ctl": {},
                "redirect": False,
            }
            denied = False
            devices.append(current)
            classes.append(match.group("cls"))
            continue
        if current is None:
            raise ParseError("indented line before any device line", line_no, line)
        stripped = line.strip()
        if stripped == "Capabilities: <access denied>":
            denied = True
        elif stripped.startswith("Capabilities:") and "Access Control Services" in stripped:
            current["acs"] = True
        elif current["acs"] and (match := _FLAGS_RE.match(line)):
            key = "acs_cap" if match.group(1) == "ACSCap" else "acs_ctl"
            current[key] = _flags(match.group(2), line_no, line)  # type: ignore[literal-required]
    if current is not None and denied and not current["acs"]:
        current["acs"] = None
    for device in devices:
        if device["acs"] is None:
            device["redirect"] = None
        else:
            device["redirect"] = any(device["acs_ctl"].get(f, False) for f in REDIRECT_FLAGS)
    if bridges_only:
        # PCI-to-PCI bridges (root ports, switch ports) route peer traffic; host and ISA
        # bridges do not.
        return [d for d, cls in zip(devices, classes, strict=True) if cls == "PCI bridge"]
    return devices
