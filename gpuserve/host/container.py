"""Container GPU hosts (a Proxmox LXC container, systemd-nspawn, ...): what the host
deploy does there, decided from what the container shows.

A container shares the kernel of the machine it runs on, so the NVIDIA kernel module is
that machine's: the container needs the userspace driver of exactly the module's
version (NVML refuses a mismatch: "Driver/library version mismatch") and must leave
alone what belongs to the kernel (modules, parameters, initramfs, reboots). Its GPU
peer-to-peer is the machine's own, as on bare metal. docs/deploys.md says more.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuserve.errors import InputError
from gpuserve.parsers.nvidia_driver import parse_proc_version

# NVIDIA's CUDA repository, compute-only (headless) userspace: the driver's CUDA and NVML
# libraries, nvidia-smi and the persistence daemon, without a kernel module package
# (NVIDIA Driver Installation Guide, Debian, "Compute-only (Headless) and Desktop-only
# (no Compute) Installation": nvidia-driver-cuda beside nvidia-kernel-open-dkms, the
# latter left out here because the module is the container's host's).
USERSPACE_PACKAGE = "nvidia-driver-cuda"
PIN_FILE = "/etc/apt/preferences.d/gpuserve-nvidia-userspace"
# what apt may install of NVIDIA's driver in the container: the module's version only
# (apt_preferences(5): glob patterns in Package, Pin: version, priority >= 1000 even
# downgrades)
PIN_PACKAGES = "nvidia-* libnvidia-* libcuda* libnvcuvid* libnvoptix*"

# What the host deploy skips in a container, and why (one line each in its output).
SKIPPED = (
    ("kernel parameters", "the kernel command line is the container host's"),
    ("nouveau blacklist and initramfs", "kernel modules are loaded by the container host"),
    ("NVIDIA kernel module (DKMS, linux-headers)",
     "the module is the container host's; only its userspace is installed here"),
    ("nvidia-persistenced", "persistence mode is set where the module runs, on the "
                            "container host"),
    ("reboot for the kernel", "a container's reboot does not change the kernel"),
)

# What systemd-detect-virt prints inside a container (systemd's src/basic/virt.c,
# container names; without --vm it names the container, not a VM below it): a container
# shares its host's kernel, so its GPUs' P2P is its host's, not a guest's.
CONTAINER_NAMES = frozenset({"openvz", "lxc", "lxc-libvirt", "systemd-nspawn", "docker",
                             "podman", "rkt", "wsl", "proot", "pouch"})

_VERSION = re.compile(r"^\d+\.\d+(?:\.\d+)?$")


def parse_container(output: list[str]) -> str | None:
    """``systemd-detect-virt --container``: "lxc", "systemd-nspawn", "docker" ...; None
    outside a container (it prints "none"), without the tool, or for anything that is
    not one of systemd's container names."""
    value = next((ln.strip() for ln in output if ln.strip()), "")
    return value if value in CONTAINER_NAMES else None


def parse_module_version(output: list[str]) -> str | None:
    """The kernel module's version: the ``NVRM version:`` line of
    /proc/driver/nvidia/version (open or proprietary module), else a bare version line
    (what ``nvidia-smi --query-gpu=driver_version`` prints). None when neither is there."""
    if any(line.startswith("NVRM version:") for line in output):
        return parse_proc_version(output)["version"]  # ParseError on an odd banner
    for line in output:
        if _VERSION.match(line.strip()):
            return line.strip()
    return None


def parse_index_versions(lines: list[str], package: str) -> list[str]:
    """Every version of ``package`` that a repository's Packages index lists (from its
    ``Package:`` and ``Version:`` lines), in the index's order."""
    versions, current = [], None
    for line in lines:
        key, _, value = line.partition(":")
        if key == "Package":
            current = value.strip()
        elif key == "Version" and current == package:
            versions.append(value.strip())
    return versions


@dataclass(frozen=True)
class UserspacePlan:
    """The userspace driver a container host gets: exactly its kernel module's version."""

    module_version: str
    deb_version: str

    @property
    def branch(self) -> int:
        return int(self.module_version.split(".")[0])

    @property
    def package_spec(self) -> str:
        return f"{USERSPACE_PACKAGE}={self.deb_version}"

    def pin_text(self) -> str:
        return ("# gpuserve: the userspace driver matches the container host's kernel module\n"
                f"# ({self.module_version}); apt installs no other version of it.\n"
                f"Package: {PIN_PACKAGES}\nPin: version {self.deb_version}\n"
                "Pin-Priority: 1000\n")


def userspace_plan(module_version: str | None, available: list[str] | None, *,
                   container: str, repo_url: str, source: str | None,
                   host: str) -> UserspacePlan:
    """The package of exactly the module's version, or an InputError that names both
    versions (the module's and what the repository offers) before any change."""
    if module_version is None:
        raise InputError(source, None, (
            f"{host}: a container host ({container}) with no NVIDIA kernel module in sight "
            "(no /proc/driver/nvidia/version, no nvidia-smi): bind the GPUs' device nodes "
            "into the container and load the driver on its host (deploy/hypervisor.py "
            "with proxmox_ctid does both sides' config for a Proxmox LXC container)"))
    if available is None:
        raise InputError(source, "nvidia_repo_url", (
            f"{host}: could not read {repo_url}Packages.gz from the host, so the userspace "
            f"driver {module_version} (the container host's kernel module) cannot be "
            "checked before any change"))
    wanted = [v for v in available if v.split("-")[0] == module_version]
    if not wanted:
        branch = module_version.split(".")[0]
        offered = sorted({v for v in available if v.startswith(f"{branch}.")}) or available
        raise InputError(source, "nvidia_repo_url", (
            f"{host}: the container host's NVIDIA kernel module is {module_version}, but "
            f"{repo_url} has no {USERSPACE_PACKAGE} of that version (it offers "
            f"{', '.join(offered) or 'none'}): the userspace driver must match the module "
            "exactly; point nvidia_repo_url at a repository that has it, or update the "
            "driver on the container's host"))
    return UserspacePlan(module_version, sorted(wanted)[-1])


def skipped_lines(host: str, container: str) -> list[str]:
    """One line per step the host deploy leaves out in a container, with its reason."""
    return [f"{host}: container host ({container}): {step} skipped: {why}"
            for step, why in SKIPPED]
