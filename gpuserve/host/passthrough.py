"""Proxmox GPU passthrough decisions: PCI inventory, vfio ids, MMIO window, qm config diff.

Sources: Proxmox VE admin guide ``qm-pci-passthrough.adoc`` and ``qm.adoc``
(hostpciN syntax, q35/OVMF, vfio-pci ``ids=``); QEMU vfio-pci property
``x-nv-gpudirect-clique`` (qemu ``hw/vfio/pci-quirks.c``, used for Proxmox in
noonghunna/club-3090 PR#890); OVMF's ``opt/ovmf/X-PciMmio64Mb`` fw_cfg knob
(edk2 ``OvmfPkg/Library/PlatformInitLib/MemDetect.c``).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

NVIDIA_VENDOR = "10de"
# PCI class codes: 0x0300 VGA, 0x0302 3D controller (datacenter GPUs), 0x0403 HD audio.
GPU_CLASSES = ("0300", "0302")
AUDIO_CLASS = "0403"
OVMF_DEFAULT_MMIO64_MB = 32 * 1024  # OVMF's default 64-bit aperture is 32 GiB (MemDetect.c)
BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")

# Shell that lists NVIDIA PCI functions from sysfs (no lspci needed): one
# "dev <bdf> <vendor> <device> <class>" line per function, then its
# "res <start> <end> <flags>" lines from the sysfs 'resource' file (one per BAR, the
# first six). Shell builtins only (read, echo): a process per PCI function cost most of
# a no-op host rerun's time on the lab host, and a real host has a hundred functions.
SYSFS_PCI_COMMAND = (
    "for d in /sys/bus/pci/devices/*; do "
    'read -r v < "$d/vendor" 2>/dev/null && [ "$v" = 0x10de ] || continue; '
    'read -r dv < "$d/device"; read -r c < "$d/class"; '
    'echo "dev ${d##*/} $v $dv $c"; n=0; '
    'while [ $n -lt 6 ] && read -r r; do echo "res $r"; n=$((n+1)); done < "$d/resource"; '
    "done; true"
)


@dataclass
class PciFunction:
    address: str
    vendor: str
    device: str
    pci_class: str
    bars: list[int] = field(default_factory=list)  # sizes in bytes of 64-bit memory BARs

    @property
    def is_gpu(self) -> bool:
        return self.vendor == NVIDIA_VENDOR and self.pci_class[:4] in GPU_CLASSES

    @property
    def id(self) -> str:
        return f"{self.vendor}:{self.device}"


def parse_sysfs_pci(lines: list[str] | str | None) -> list[PciFunction]:
    """Parse the output of :data:`SYSFS_PCI_COMMAND`.

    BAR flags come from the kernel's IORESOURCE bits (``include/linux/ioport.h``):
    0x200 = MEM, 0x00100000 = MEM_64. Only 64-bit memory BARs count for the window.
    """
    if isinstance(lines, str):
        lines = lines.splitlines()
    functions: list[PciFunction] = []
    for line in lines or []:
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "dev" and len(parts) == 5:
            functions.append(
                PciFunction(
                    address=parts[1].lower(),
                    vendor=parts[2].lower().removeprefix("0x"),
                    device=parts[3].lower().removeprefix("0x"),
                    pci_class=parts[4].lower().removeprefix("0x"),
                )
            )
        elif parts[0] == "res" and len(parts) == 4 and functions:
            start, end, flags = (int(p, 16) for p in parts[1:])
            if flags & 0x200 and flags & 0x00100000 and end > start:
                functions[-1].bars.append(end - start + 1)
    return functions


def gpus_and_companions(functions: list[PciFunction]) -> tuple[list[PciFunction], list[str]]:
    """The NVIDIA GPU functions, and the vfio ids to bind (GPUs plus their audio functions).

    A consumer/workstation card exposes an HD-audio function next to the GPU; it sits in
    the same IOMMU group and must be bound to vfio-pci too (Proxmox passthrough guide).
    """
    gpus = [f for f in functions if f.is_gpu]
    slots = {g.address.rsplit(".", 1)[0] for g in gpus}
    ids: list[str] = []
    for f in functions:
        if f.vendor != NVIDIA_VENDOR:
            continue
        companion = f.pci_class[:4] == AUDIO_CLASS and f.address.rsplit(".", 1)[0] in slots
        if (f.is_gpu or companion) and f.id not in ids:
            ids.append(f.id)
    return gpus, ids


def mmio_window_mb(bar_sizes_per_gpu: list[list[int]]) -> int:
    """OVMF 64-bit MMIO aperture (MiB) that fits every GPU's 64-bit BARs.

    BARs are naturally aligned powers of two, so a power-of-two window at least as large
    as their sum always fits them; never below OVMF's 32 GiB default. An RTX PRO 6000
    96 GB has a 128 GiB BAR1 plus 32 MiB BAR3, so 8 cards need 2 TiB (2097152 MiB).
    """
    total = sum(sum(bars) for bars in bar_sizes_per_gpu)
    total_mb = -(-total // (1024 * 1024))
    window = OVMF_DEFAULT_MMIO64_MB
    while window < total_mb:
        window *= 2
    return window


def parse_qm_config(text: str) -> dict[str, str]:
    """``qm config`` / ``/etc/pve/qemu-server/<vmid>.conf`` -> {key: value}.

    Proxmox's format is ``key: value`` lines; comment lines (``#``) are the description;
    ``[name]`` starts a snapshot or the pending section, whose keys are not current.
    """
    config: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            break
        if ":" not in line:
            continue
        key, value = line.split(":", 1)
        config[key.strip()] = value.strip()
    return config


_MMIO_ARG = re.compile(r"^name=opt/ovmf/X-PciMmio64Mb,")
_CLIQUE_ARG = re.compile(r"^device\.hostpci\d+\.x-nv-gpudirect-clique=")


def merge_args(current: str | None, mmio_mb: int | None, clique: int | None, count: int) -> str:
    """The VM's ``args:`` with gpuserve's options replaced and any other options kept."""
    tokens = shlex.split(current or "")
    kept: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
        ours = (tok == "-fw_cfg" and _MMIO_ARG.match(nxt)) or (
            tok == "-set" and _CLIQUE_ARG.match(nxt)
        )
        if ours:
            i += 2
            continue
        kept.append(tok)
        i += 1
    ours: list[str] = []
    if mmio_mb:
        ours += ["-fw_cfg", f"name=opt/ovmf/X-PciMmio64Mb,string={mmio_mb}"]
    if clique is not None:
        for n in range(count):
            ours += ["-set", f"device.hostpci{n}.x-nv-gpudirect-clique={clique}"]
    return " ".join(shlex.quote(t) for t in kept + ours)


def _cpu_value(current: str | None) -> str:
    """``cpu: host`` keeping extra options but never ``hidden=1``.

    ``hidden=1`` emits ``kvm=off``; the guest driver honours the P2P clique only when it
    detects a hypervisor (club-3090 PR#890).
    """
    opts = [o for o in (current or "").split(",")[1:] if o and not o.startswith("hidden=")]
    return ",".join(["host", *opts])


def _machine_ok(value: str | None) -> bool:
    # "q35", "pc-q35-8.1", "q35,viommu=intel" are all q35 machines.
    return bool(value) and bool(re.match(r"^(pc-)?q35\b", value.split(",")[0]))


def _hostpci_ok(value: str | None, address: str) -> bool:
    if not value:
        return False
    parts = value.split(",")
    host = parts[0].removeprefix("host=")
    opts = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
    return host == address and opts.get("pcie") in ("1", "on") and opts.get("hidden") != "1"


def desired_vm_changes(
    current: dict[str, str],
    gpus: list[str],
    mmio_mb: int | None,
    clique: int | None,
) -> dict[str, str]:
    """Only the keys whose current value differs from what the GPUs need.

    ``gpus`` are full function addresses (``0000:01:00.0``): an explicit ``.0`` passes
    the GPU function alone, and the clique option addresses ``hostpciN`` by index.
    """
    changes: dict[str, str] = {}
    if not _machine_ok(current.get("machine")):
        changes["machine"] = "q35"
    if current.get("bios") != "ovmf":
        changes["bios"] = "ovmf"
    cpu = _cpu_value(current.get("cpu"))
    if current.get("cpu") != cpu:
        changes["cpu"] = cpu
    for n, address in enumerate(gpus):
        key = f"hostpci{n}"
        if not _hostpci_ok(current.get(key), address):
            changes[key] = f"{address},pcie=1"
    args = merge_args(current.get("args"), mmio_mb, clique, len(gpus))
    if args and args != (current.get("args") or ""):
        changes["args"] = args
    return changes


def qm_set_command(vmid: int, changes: dict[str, str]) -> str:
    """``qm set <vmid> --key value ...`` with every value shell-quoted."""
    parts = ["qm", "set", str(vmid)]
    for key in sorted(changes):
        parts += [f"--{key}", changes[key]]
    return " ".join(shlex.quote(p) for p in parts)


VFIO_MODULES = ("vfio", "vfio_iommu_type1", "vfio_pci")
