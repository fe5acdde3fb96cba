"""Validation of the host data that deploy/host.py and deploy/hypervisor.py consume.

Runs at prepare time, before any operation, so a typo in an inventory stops the deploy
with ``inventory/gpu.py: cuda_lane: ...`` instead of half-provisioning a host. The
defaults themselves are documented once, in each role's ``DEFAULTS``; the deploy
scripts merge them under ``host.data`` and hand the result here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from gpuserve.errors import InputError
from gpuserve.host import boot, driver, nccl_env, passthrough


def _bool(data: dict, key: str, src: str) -> bool:
    value = data.get(key)
    if not isinstance(value, bool):
        raise InputError(src, key, f"must be True or False, got {value!r}")
    return value


def _int(data: dict, key: str, src: str, low: int, high: int | None = None) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (
        high is not None and value > high
    ):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise InputError(src, key, f"must be an integer {bound}, got {value!r}")
    return value


def _params(data: dict, key: str, src: str) -> list[str]:
    value = data.get(key) or []
    if not isinstance(value, list) or not all(
        isinstance(p, str) and re.fullmatch(r"[A-Za-z0-9_.\-]+(=[^\s'\"]+)?", p) for p in value
    ):
        raise InputError(src, key, f"must be a list of kernel parameters (k or k=v), got {value!r}")
    return list(value)


def _url(data: dict, key: str, src: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or urlparse(value).scheme not in ("http", "https", "file"):
        raise InputError(src, key, f"must be an http(s) or file URL, got {value!r}")
    return value if value.endswith("/") else value + "/"


@dataclass
class KernelSettings:
    iommu_passthrough: bool
    pci_noacs: bool
    extra_params: list[str]
    allow_reboot: bool
    reboot_timeout: int

    def params(self, cpu_vendor: str | None, acpi_tables: set[str] | None = None) -> list[str]:
        """The kernel parameters this host must boot with."""
        kind = boot.iommu_kind(cpu_vendor, acpi_tables)
        return boot.iommu_params(kind, self.iommu_passthrough, self.pci_noacs) + list(
            self.extra_params
        )


@dataclass
class HostSettings:
    kernel: KernelSettings
    repo_url: str | None
    branch: int
    flavour: str
    mok_enrolled: bool
    install_headers: bool
    debian_contrib: bool
    persistence: bool
    cuda_lane: str
    nccl_overrides: dict[str, str] = field(default_factory=dict)
    gates: Any = None  # gpuserve.measure.gate_runs.GateSettings (gpuserve/plans/host.py)
    results_dir: str = "results"  # where the measuring stage records (roles.checks)
    fabric: Any = None  # gpuserve.host.fabric.FabricSettings (gpuserve/host/plan.py)
    rdma: str = "auto"  # roles/rdma: auto, on, off (gpuserve.host.rdma.rdma_mode)
    rdma_loopback: int = 0  # roles/rdma: seconds of perftest loopback per port, 0 off
    rdma_pairs: Any = None  # roles/rdma: gpuserve.host.rdma_pairs.PairSettings or None
    keyring_sha256: str | None = None  # nvidia_keyring_sha256, None: the published one


def kernel_settings(data: dict[str, Any], src: str) -> KernelSettings:
    return KernelSettings(
        iommu_passthrough=_bool(data, "iommu_passthrough", src),
        pci_noacs=_bool(data, "pci_noacs", src),
        extra_params=_params(data, "kernel_extra_params", src),
        allow_reboot=_bool(data, "allow_reboot", src),
        reboot_timeout=_int(data, "reboot_timeout", src, 30),
    )


def host_settings(data: dict[str, Any], src: str) -> HostSettings:
    """Validated settings for deploy/host.py; raises InputError naming ``src`` and the key."""
    try:
        branch = driver.parse_branch(data.get("nvidia_driver_branch"))
    except ValueError as exc:
        raise InputError(src, "nvidia_driver_branch", str(exc)) from None
    flavour = data.get("nvidia_driver_flavour")
    if flavour not in driver.FLAVOURS:
        raise InputError(
            src, "nvidia_driver_flavour", f"must be one of {', '.join(driver.FLAVOURS)}, "
            f"got {flavour!r}"
        )
    lane = str(data.get("cuda_lane"))
    problem = driver.lane_problem(lane, branch)
    if problem:
        raise InputError(src, "cuda_lane", problem)
    try:
        overrides = nccl_env.validate_overrides(data.get("nccl_env"))
    except ValueError as exc:
        raise InputError(src, "nccl_env", str(exc)) from None
    return HostSettings(
        kernel=kernel_settings(data, src),
        repo_url=_url(data, "nvidia_repo_url", src),
        branch=branch,
        flavour=flavour,
        mok_enrolled=_bool(data, "nvidia_secure_boot_mok_enrolled", src),
        install_headers=_bool(data, "nvidia_install_headers", src),
        debian_contrib=_bool(data, "nvidia_debian_contrib", src),
        persistence=_bool(data, "nvidia_persistenced", src),
        cuda_lane=lane,
        nccl_overrides=overrides,
    )


@dataclass
class HypervisorSettings:
    kernel: KernelSettings
    vmid: int | None
    ctid: int | None
    gpus: list[str] | None
    vfio_ids: list[str] | None
    mmio_window_mb: int | None
    clique: int | None
    restart_vm: bool


def hypervisor_settings(data: dict[str, Any], src: str) -> HypervisorSettings:
    """Validated settings for deploy/hypervisor.py; raises InputError naming the key.
    Exactly one guest: a VM (``proxmox_vmid``, passthrough) or an LXC container
    (``proxmox_ctid``, the host's driver shared)."""
    vmid, ctid = data.get("proxmox_vmid"), data.get("proxmox_ctid")
    if vmid is not None and ctid is not None:
        raise InputError(src, "proxmox_ctid", f"give proxmox_vmid (a VM, GPUs passed through) "
                         f"or proxmox_ctid (an LXC container), not both: got {vmid!r} and {ctid!r}")
    key, guest = ("proxmox_ctid", ctid) if ctid is not None else ("proxmox_vmid", vmid)
    if isinstance(guest, bool) or not isinstance(guest, int) or not 100 <= guest <= 999999999:
        # Proxmox guest ids (VMs and containers share them) are 100..999999999 (pve-docs,
        # qm.adoc and pct.adoc, "vmid").
        kind = "container" if key == "proxmox_ctid" else "VM"
        raise InputError(src, key, f"must be a Proxmox {kind} id (100..999999999), got "
                         f"{guest!r}" + ("" if ctid is not None else
                                         "; or set proxmox_ctid for an LXC container"))
    gpus = data.get("proxmox_gpus")
    if gpus is not None and (
        not isinstance(gpus, list)
        or not gpus
        or not all(isinstance(g, str) and passthrough.BDF.match(g) for g in gpus)
    ):
        raise InputError(src, "proxmox_gpus", "must be a list of full PCI function addresses "
                         f"such as '0000:01:00.0' (explicit .0 function), got {gpus!r}")
    ids = data.get("proxmox_vfio_ids")
    if ids is not None and (
        not isinstance(ids, list)
        or not all(isinstance(i, str) and re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{4}", i) for i in ids)
    ):
        raise InputError(src, "proxmox_vfio_ids", f"must be a list like ['10de:2bb5'], got {ids!r}")
    mmio = data.get("proxmox_mmio_window_mb")
    if mmio is not None:
        mmio = _int(data, "proxmox_mmio_window_mb", src, 1024)
    clique = data.get("proxmox_gpudirect_clique")
    if clique is not None:
        clique = _int(data, "proxmox_gpudirect_clique", src, 0, 15)
    return HypervisorSettings(
        kernel=kernel_settings(data, src),
        vmid=vmid,
        ctid=ctid,
        gpus=gpus,
        vfio_ids=ids,
        mmio_window_mb=mmio,
        clique=clique,
        restart_vm=_bool(data, "proxmox_restart_vm", src),
    )
