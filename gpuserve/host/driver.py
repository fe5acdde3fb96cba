"""Driver branch, flavour and CUDA lane decisions for host provisioning.

Pure logic over the data in ``gpuserve/data/host/nvidia.yaml``: which packages pin a
driver branch, whether a CUDA lane can run on that branch, and whether the GPUs allow
the proprietary kernel-module flavour at all. The roles turn these answers into
operations; keeping them here means the refusals are unit-testable without a host.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Any

from gpuserve import safeload, versions
from gpuserve.errors import GpuserveError
from gpuserve.paths import DATA_DIR

FLAVOURS = ("open", "proprietary")


class HostRefusal(GpuserveError):
    """A host that must not be provisioned as asked (wrong flavour, lane, Secure Boot)."""


@cache
def nvidia_data() -> dict[str, Any]:
    """The committed driver/lane table (a data file, so updating a lane is not a code change)."""
    return safeload.load_yaml_file(DATA_DIR / "host" / "nvidia.yaml")


def repository_branch_problem(distro_id: str | None, version_id: str | None,
                              branch: int) -> str | None:
    """Why NVIDIA's repository for this distribution cannot give ``branch`` (with the
    branch that it can), or None. Debian 13: no R580 (gpuserve/data/host/nvidia.yaml)."""
    rule = repository_min_branch(distro_id, version_id)
    if rule is None or branch >= rule[1]:
        return None
    distro, min_branch, why = rule
    return (f"driver branch {branch} cannot be installed on {distro}: {why}; set "
            f"nvidia_driver_branch={min_branch} (or later; CUDA lanes 12.8 to 13.0 "
            "run on it)")


def repository_min_branch(distro_id: str | None, version_id: str | None
                          ) -> tuple[str, int, str] | None:
    """(distribution, lowest branch, why) where NVIDIA's repository for the distribution
    lacks older branches, else None (gpuserve/data/host/nvidia.yaml)."""
    if not distro_id or not version_id:
        return None
    distro = f"{distro_id.lower()}{version_id.replace('.', '')}"
    rule = (nvidia_data().get("repository_min_branch") or {}).get(distro)
    return None if rule is None else (distro, int(rule["min_branch"]), rule["why"])


def lanes() -> dict[str, dict[str, str]]:
    """CUDA lanes gpuserve knows, keyed ``"12.8"`` ... with package, min_driver, sglang."""
    return nvidia_data()["cuda_lanes"]


@dataclass(frozen=True)
class DriverPlan:
    """Packages to install, in order, for one branch and flavour."""

    branch: int
    flavour: str
    packages: tuple[str, ...]
    pinning_package: str | None


def parse_branch(value: object) -> int:
    """A driver branch is a three-digit major such as 580 (``"580"`` accepted)."""
    text = str(value).strip()
    if not re.fullmatch(r"[1-9]\d{2}", text):
        raise ValueError(f"driver branch must be a three-digit major such as 580, got {value!r}")
    return int(text)


def driver_plan(branch: int, flavour: str) -> DriverPlan:
    """The meta-packages that install ``flavour`` locked to ``branch``.

    Up to 580 NVIDIA's repository has versioned metas (``nvidia-open-580``); from 590
    the branch is locked by installing ``nvidia-driver-pinning-<branch>`` *before* the
    unversioned meta (NVIDIA Driver Installation Guide, "Version locking"); 580 gets
    both (see first_pinning_branch in the data file).
    """
    if flavour not in FLAVOURS:
        raise ValueError(f"flavour must be one of {', '.join(FLAVOURS)}, got {flavour!r}")
    data = nvidia_data()
    meta = data["flavours"][flavour]
    pin = f"nvidia-driver-pinning-{branch}" if branch >= int(data["first_pinning_branch"]) else None
    if branch <= int(data["last_versioned_meta_branch"]):
        meta = f"{meta}-{branch}"
    return DriverPlan(branch, flavour, tuple(p for p in (pin, meta) if p), pin)


def flavour_meta(flavour: str) -> str:
    """The flavour's unversioned meta-package (``nvidia-open``, ``cuda-drivers``): every
    branch's driver installs it (the versioned metas up to 580 depend on it at their own
    version), so its installed version is the driver's."""
    return str(nvidia_data()["flavours"][flavour])


def upstream(deb_version: str) -> str:
    """``580.126.20-1`` -> ``580.126.20`` (epoch and Debian revision dropped)."""
    return deb_version.split(":", 1)[-1].split("-", 1)[0]


@dataclass(frozen=True)
class KernelDriverChange:
    """On a host with a kernel of its own: the driver installed (the flavour meta's
    version) against the branch planned. A branch change must move the driver, and
    Fabric Manager with it: the metas of the new branch are installed already (580's
    ``nvidia-open-580`` pulled ``nvidia-open``), so "is it installed" never says so."""

    plan: DriverPlan
    installed: str | None  # deb version of flavour_meta, None: no driver

    @property
    def from_branch(self) -> int | None:
        if not self.installed:
            return None
        major = upstream(self.installed).split(".")[0]
        return int(major) if major.isdigit() else None

    @property
    def branch_change(self) -> bool:
        return self.from_branch is not None and self.from_branch != self.plan.branch

    @property
    def leftovers(self) -> tuple[str, ...]:
        """The old branch's pinning package and versioned meta, removed before the move:
        another branch's pin left installed makes apt's candidate the newer of the two
        branches (both pin at priority 1000), and its versioned meta depends on the old
        driver."""
        if not self.branch_change:
            return ()
        old = driver_plan(int(self.from_branch or 0), self.plan.flavour)
        keep = (*self.plan.packages, flavour_meta(self.plan.flavour))  # the driver itself
        return tuple(p for p in old.packages if p not in keep)


def module_mismatch(module: str | None, installed: str | None) -> str | None:
    """Why the running kernel must be rebooted after a driver change: the loaded module
    (``580.126.20``) is not the installed driver (``590.48.01-1``); None when either
    is unknown or they agree."""
    if not module or not installed or module == upstream(installed):
        return None
    return (f"the loaded NVIDIA module is {module}, the installed driver "
            f"{upstream(installed)} (its module loads at boot)")


def lane_problem(lane: str, branch: int, installed_driver: str | None = None) -> str | None:
    """Why ``lane`` cannot run on ``branch`` (or on the installed driver), or None.

    The minimum is the lane's GA minimum from the CUDA release notes' Table 3; a branch
    runs a lane when its major is at least the minimum's major (every release of a
    branch after its first is newer than the lane's GA minimum in the table).
    """
    table = lanes()
    if lane not in table:
        return f"unknown CUDA lane {lane!r}; known lanes: {', '.join(sorted(table))}"
    minimum = table[lane]["min_driver"]
    if branch < versions.parse(minimum).major:
        return (
            f"CUDA {lane} needs driver >= {minimum} (CUDA release notes, Table 3) "
            f"but the pinned driver branch is {branch}"
        )
    if installed_driver:
        try:
            installed = versions.parse(installed_driver)
        except ValueError:
            return None
        if installed < versions.parse(minimum):
            return (
                f"CUDA {lane} needs driver >= {minimum} but driver {installed_driver} "
                "is installed"
            )
    return None


def sglang_release_for_lane(lane: str) -> str:
    """The newest SGLang whose PyPI stack targets a lane's CUDA (12.x -> 0.5.10.post1)."""
    return lanes()[lane]["sglang"]


def _pci_id_is_open_only(device_id: str) -> bool:
    value = int(device_id, 16)
    for low, high in nvidia_data()["open_only_pci_device_ranges"]:
        if int(low, 16) <= value <= int(high, 16):
            return True
    return False


def open_only_gpus(
    gpus: list[dict[str, Any]] | None, pci_devices: list[dict[str, str]] | None
) -> list[str]:
    """Names (or PCI ids) of the GPUs that only run with the open kernel modules.

    ``gpus`` are nvidia-smi records (``compute_cap``, ``name``); ``pci_devices`` are
    sysfs records (``vendor``, ``device``) for hosts without a driver yet.
    """
    found: list[str] = []
    min_cc = int(nvidia_data()["open_only_min_compute_cap"])
    for gpu in gpus or []:
        cap = str(gpu.get("compute_cap") or "")
        if re.fullmatch(r"\d+\.\d+", cap) and int(cap.split(".")[0]) >= min_cc:
            found.append(f"{gpu.get('name', 'GPU')} (compute capability {cap})")
    for dev in pci_devices or []:
        if dev.get("vendor", "").lower() in ("10de", "0x10de") and _pci_id_is_open_only(
            dev["device"].lower().removeprefix("0x")
        ):
            found.append(f"PCI {dev.get('address', '?')} [10de:{dev['device'].removeprefix('0x')}]")
    return found


def check_flavour(flavour: str, gpus, pci_devices) -> None:
    """Refuse the proprietary flavour on Blackwell-or-later GPUs, naming them."""
    if flavour != "proprietary":
        return
    blocked = open_only_gpus(gpus, pci_devices)
    if blocked:
        counts: dict[str, int] = {}
        for item in blocked:
            counts[item] = counts.get(item, 0) + 1
        listed = ", ".join(f"{n}x {item}" if n > 1 else item for item, n in counts.items())
        raise HostRefusal(
            f"nvidia_driver_flavour=proprietary refused: {listed}"
            " run only with the open kernel modules (NVIDIA driver README, "
            "'Open Linux Kernel Modules': Blackwell and later are only supported by the "
            "open kernel modules; the proprietary modules fail with RmInitAdapter). "
            "Use nvidia_driver_flavour=open."
        )


SECURE_BOOT_HELP = """\
Secure Boot is enabled on {host}: the NVIDIA kernel modules are built by DKMS and load
only when signed with a Machine Owner Key (MOK) the firmware trusts. Enrolling a MOK
needs someone at the console during the next boot, so gpuserve stops here. To proceed:
  1. On the host: apt-get install dkms mokutil  (DKMS creates /var/lib/dkms/mok.key and
     /var/lib/dkms/mok.pub on first use: `dkms generate_mok` when absent)
  2. mokutil --import /var/lib/dkms/mok.pub   (choose a one-time password)
  3. Reboot with console access, pick "Enroll MOK" in the blue MokManager screen,
     enter the password.
  4. Re-run the deploy with host data nvidia_secure_boot_mok_enrolled=True.
(Alternatively disable Secure Boot in the firmware setup.)"""


def check_secure_boot(secure_boot: bool | None, mok_enrolled: bool, host: str) -> None:
    """Stop with MOK-enrollment instructions when Secure Boot is on and no MOK is declared."""
    if secure_boot and not mok_enrolled:
        raise HostRefusal(SECURE_BOOT_HELP.format(host=host))


def repo_url_for(distro_id: str | None, version_id: str | None, arch: str | None) -> str:
    """NVIDIA's CUDA repository base URL for a distribution.

    ``<distro>`` is os-release ``$ID$VERSION_ID`` without the dot (debian12, ubuntu2404)
    and Arm servers use ``sbsa`` (CUDA Installation Guide for Linux, "Network Repo
    Installation").
    """
    if not distro_id or not version_id:
        raise ValueError("cannot tell the distribution (os-release ID/VERSION_ID missing)")
    distro = f"{distro_id.lower()}{version_id.replace('.', '')}"
    repo_arch = "sbsa" if arch in ("aarch64", "arm64") else "x86_64"
    return f"https://developer.download.nvidia.com/compute/cuda/repos/{distro}/{repo_arch}/"


def repo_list_name(repo_url: str) -> str:
    """``cuda-debian12-x86_64``: the name cuda-keyring gives its own sources.list entry."""
    parts = [p for p in repo_url.rstrip("/").split("/") if p]
    return f"cuda-{parts[-2]}-{parts[-1]}" if len(parts) >= 2 else "cuda"


def with_contrib(text: str) -> str:
    """Debian APT sources with ``contrib`` added wherever ``main`` is enabled.

    NVIDIA's Debian instructions enable contrib before installing the driver
    (driver-installation-guide, Debian: ``add-apt-repository contrib``). Handles both the
    one-line format (sources.list) and deb822 stanzas (debian.sources); other lines and
    repositories without a ``main`` component are left as they are.
    """
    out: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(("deb ", "deb-src ")):
            words = stripped.split()
            if "main" in words[2:] and "contrib" not in words[2:]:
                line = line.rstrip() + " contrib"
        elif stripped.lower().startswith("components:"):
            words = stripped.split()[1:]
            if "main" in words and "contrib" not in words:
                line = line.rstrip() + " contrib"
        out.append(line)
    result = "\n".join(out)
    return result + "\n" if text.endswith("\n") or result else result
