"""Which NVIDIA driver is on a host, and which kernel-module flavour (open/proprietary).

Two kinds of evidence: the banner of the loaded module in /proc/driver/nvidia/version,
and the installed packages when no module is loaded (freshly installed, reboot pending).
Blackwell GPUs work only with the open modules ("Blackwell and later are only supported
by the open kernel modules", NVIDIA driver README, chapter kernel_open:
https://download.nvidia.com/XFree86/Linux-x86_64/580.95.05/README/kernel_open.html).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal, TypedDict

from gpuserve.parsers.common import ParseError, as_lines

Flavour = Literal["open", "proprietary"]

# "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  590.48.01  Release Build ..."
# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024"
_NVRM_RE = re.compile(r"^NVRM version:\s+NVIDIA UNIX\b(?P<what>.*?Kernel Module\b.*?)\s+"
                      r"(?P<version>\d+\.\d+(?:\.\d+)*)\b")


class DriverBanner(TypedDict):
    version: str
    flavour: Flavour


def parse_proc_version(text: str | Iterable[str]) -> DriverBanner:
    """Parse /proc/driver/nvidia/version (the NVRM line; the GCC line is ignored)."""
    for line_no, line in enumerate(as_lines(text), start=1):
        if not line.startswith("NVRM version:"):
            continue
        match = _NVRM_RE.match(line)
        if not match:
            raise ParseError("unrecognised NVRM banner", line_no, line)
        flavour: Flavour = "open" if "Open Kernel Module" in match.group("what") else "proprietary"
        return {"version": match.group("version"), "flavour": flavour}
    raise ParseError("no 'NVRM version:' line")


# Kernel-module packages say which flavour gets built; meta-packages only imply it.
# Names: NVIDIA's CUDA repo (nvidia-open, nvidia-kernel-open-dkms, nvidia-kernel-dkms,
# see https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/), Debian
# (nvidia-open-kernel-dkms, nvidia-kernel-dkms) and Ubuntu (nvidia-dkms-<br>[-open],
# linux-modules-nvidia-<br>[-open]-<kernel>, nvidia-driver-<br>[-open]).
_OPEN_KMOD = re.compile(
    r"^(nvidia-kernel-open-dkms|nvidia-open-kernel-dkms|nvidia-dkms-open|nvidia-dkms-\d+-open"
    r"|nvidia-kernel-open-\d+|linux-modules-nvidia-\d+(-server)?-open(-.+)?"
    r"|linux-objects-nvidia-\d+(-server)?-open(-.+)?)$"
)
_PROPRIETARY_KMOD = re.compile(
    r"^(nvidia-kernel-dkms|nvidia-dkms-\d+(-server)?|nvidia-kernel-source|nvidia-kernel-\d+"
    r"|linux-(?:modules|objects)-nvidia-\d+(-server)?-\S+)$"
)
_OPEN_META = re.compile(r"^(nvidia-open|nvidia-open-\d+|nvidia-driver-\d+(-server)?-open)$")
_PROPRIETARY_META = re.compile(r"^(cuda-drivers-\d+|nvidia-driver-\d+(-server)?)$")


def flavour_from_packages(packages: Iterable[str]) -> Flavour | None:
    """The module flavour the installed packages build, or None if unknown/conflicting.

    Kernel-module packages decide; meta-packages are used only when no module package
    is installed. Unversioned ``cuda-drivers`` and ``nvidia-driver`` are ignored: their
    flavour depends on the branch (the open flavour is the default from R560).
    """
    names = set(packages)
    for open_re, prop_re in ((_OPEN_KMOD, _PROPRIETARY_KMOD), (_OPEN_META, _PROPRIETARY_META)):
        has_open = any(open_re.match(n) for n in names)
        # Ubuntu's linux-modules-nvidia-<br>[-server]-open-<kernel> also matches the
        # proprietary pattern, so names with "-open" never count as proprietary.
        has_prop = any(prop_re.match(n) and "-open" not in n for n in names)
        if has_open and not has_prop:
            return "open"
        if has_prop and not has_open:
            return "proprietary"
        if has_open and has_prop:
            return None
    return None


def parse_dpkg_installed(text: str | Iterable[str]) -> dict[str, str]:
    """Parse ``dpkg-query -W -f='${db:Status-Abbrev}\\t${Package}\\t${Version}\\n'``.

    Returns installed packages (status ``ii``/``hi``) as name -> version; packages
    removed but not purged (``rc``) are not installed and are left out.
    """
    installed: dict[str, str] = {}
    for line_no, line in enumerate(as_lines(text), start=1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 3 or len(parts[0].strip()) < 2:
            raise ParseError("expected '<status>\\t<package>\\t<version>'", line_no, line)
        status, name, version = (p.strip() for p in parts)
        if status[1] == "i":
            installed[name.split(":")[0]] = version
    return installed


def _upstream_version(debian_version: str) -> str:
    """"1:580.126.20-1ubuntu1" -> "580.126.20" (drop epoch and Debian revision)."""
    version = debian_version.split(":", 1)[-1]
    return version.rsplit("-", 1)[0] if "-" in version else version


def driver_version_from_packages(installed: dict[str, str]) -> str | None:
    """Driver version of the installed kernel-module package (None if there is none)."""
    for name in sorted(installed):
        if _OPEN_KMOD.match(name) or _PROPRIETARY_KMOD.match(name):  # either flavour
            return _upstream_version(installed[name])
    return None
