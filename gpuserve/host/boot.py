"""Kernel command-line decisions: IOMMU parameters per CPU vendor and boot-loader edits.

Pure text transformations so the kernel role stays a thin sequence of operations, and
so "does the running kernel already have what we configured" (the reboot decision and
the testinfra "reboot not pending" check) is answered by one function.

Sources: Proxmox VE admin guide, "PCI(e) Passthrough" (qm-pci-passthrough.adoc) and
"Host Bootloader" (system-booting.adoc); kernel-parameters.txt for ``iommu=pt`` and
``pci=noacs``.
"""

from __future__ import annotations

import re
import shlex

GRUB_KEY = "GRUB_CMDLINE_LINUX_DEFAULT"
BOOT_LOADERS = ("grub", "systemd-boot")


def cpu_vendor_kind(vendor: str | None) -> str | None:
    """Normalise ``GenuineIntel``/``AuthenticAMD``/``intel``/``amd`` to ``intel``/``amd``."""
    if not vendor:
        return None
    low = vendor.lower()
    if "intel" in low:
        return "intel"
    if "amd" in low or "hygon" in low:
        return "amd"
    return None


def iommu_kind(cpu_vendor: str | None, acpi_tables: set[str] | None = None) -> str | None:
    """Which IOMMU the platform has: ``intel`` (ACPI DMAR table, VT-d) or ``amd`` (IVRS).

    The firmware's ACPI table names the IOMMU; the CPU vendor is the fallback when the
    tables cannot be read (an emulated q35 with intel-iommu has a DMAR table whatever
    CPU model QEMU presents).
    """
    tables = acpi_tables or set()
    if "DMAR" in tables:
        return "intel"
    if "IVRS" in tables:
        return "amd"
    return cpu_vendor_kind(cpu_vendor)


def iommu_params(
    cpu_vendor: str | None, passthrough: bool = True, noacs: bool = False
) -> list[str]:
    """Kernel parameters that turn the IOMMU on for device passthrough.

    ``cpu_vendor`` may also be the result of :func:`iommu_kind`.

    Intel needs ``intel_iommu=on`` (on by default only from kernel 6.8, so always set
    it); on AMD the IOMMU is on by default and ``amd_iommu=on`` is not a valid switch
    (Proxmox "PCI(e) Passthrough"). ``iommu=pt`` skips DMA translation for host-owned
    devices; NVIDIA documents IOMMU-translated P2P copies as unsupported on PCIe bare
    metal. ``pci=noacs`` disables ACS redirection (nccl#2079 hangs on AMD root ports).
    """
    params: list[str] = []
    if cpu_vendor_kind(cpu_vendor) == "intel":
        params.append("intel_iommu=on")
    if passthrough:
        params.append("iommu=pt")
    if noacs:
        params.append("pci=noacs")
    return params


def _key(token: str) -> str:
    return token.split("=", 1)[0]


def _satisfied(token: str, tokens: list[str]) -> bool:
    """Whether ``token`` (``k=v`` or a flag) is in effect among ``tokens``.

    The kernel takes the last occurrence of a ``k=v`` parameter; ``pci=`` is a comma
    list of independent options, so ``pci=noacs`` is satisfied by ``pci=realloc,noacs``.
    """
    key = _key(token)
    if "=" not in token:
        return token in tokens
    values = [t.split("=", 1)[1] for t in tokens if "=" in t and _key(t) == key]
    if not values:
        return False
    wanted = token.split("=", 1)[1]
    if key == "pci":
        return any(wanted in v.split(",") for v in values)
    return values[-1] == wanted


def raw_cmdline(cmdline: str | dict | None) -> str:
    """The command line as text, from a string or the KernelCmdline fact's ``{"raw": ...}``."""
    if isinstance(cmdline, dict):
        return str(cmdline.get("raw") or "")
    return cmdline or ""


def missing_params(cmdline: str | dict | None, params: list[str]) -> list[str]:
    """Configured parameters the (running) command line lacks; empty means nothing pending."""
    tokens = raw_cmdline(cmdline).split()
    return [p for p in params if not _satisfied(p, tokens)]


def merge_params(existing: str, params: list[str]) -> str:
    """``existing`` with ``params`` applied: same-key values replaced, others appended.

    Unrelated parameters keep their place (``quiet``, ``console=...``), so editing
    twice gives the same line (idempotent).
    """
    tokens = existing.split()
    for param in params:
        if _satisfied(param, tokens):
            continue
        key = _key(param)
        if "=" in param and key == "pci":
            idx = next((i for i, t in enumerate(tokens) if _key(t) == "pci" and "=" in t), None)
            if idx is not None:
                tokens[idx] = f"{tokens[idx]},{param.split('=', 1)[1]}"
                continue
        if "=" in param:
            same = [i for i, t in enumerate(tokens) if "=" in t and _key(t) == key]
            if same:
                tokens[same[-1]] = param
                continue
        tokens.append(param)
    return " ".join(tokens)


_GRUB_LINE = re.compile(rf"^(?P<lead>\s*(?:export\s+)?){GRUB_KEY}=(?P<value>.*)$")


def _unquote(value: str) -> str:
    try:
        parts = shlex.split(value, comments=False, posix=True)
    except ValueError:
        return value.strip().strip("\"'")
    return " ".join(parts)


def edit_grub_default(text: str, params: list[str]) -> str:
    """``/etc/default/grub`` with the parameters merged into GRUB_CMDLINE_LINUX_DEFAULT.

    The last assignment wins in the sourced shell file, so that one is edited; a file
    without the key gets one appended. The value is written double-quoted as Debian's
    default file does.
    """
    lines = text.splitlines()
    index = None
    for i, line in enumerate(lines):
        if _GRUB_LINE.match(line):
            index = i
    if index is None:
        merged = merge_params("", params)
        lines.append(f'{GRUB_KEY}="{merged}"')
    else:
        match = _GRUB_LINE.match(lines[index])
        assert match is not None
        current = _unquote(match.group("value"))
        merged = merge_params(current, params)
        if merged == current:
            return text
        lines[index] = f'{match.group("lead")}{GRUB_KEY}="{merged}"'
    return "\n".join(lines) + "\n"


def grub_default_value(text: str) -> str | None:
    """The effective GRUB_CMDLINE_LINUX_DEFAULT value of a ``/etc/default/grub`` text."""
    value = None
    for line in text.splitlines():
        match = _GRUB_LINE.match(line)
        if match:
            value = _unquote(match.group("value"))
    return value


def edit_kernel_cmdline_file(text: str, params: list[str]) -> str:
    """``/etc/kernel/cmdline`` (systemd-boot / proxmox-boot-tool): one line, merged.

    proxmox-boot-tool reads the whole file as a single command line (system-booting.adoc:
    "all parameters on a single line"), so the result is exactly one line.
    """
    current = " ".join(text.split())
    merged = merge_params(current, params)
    return merged + "\n"


def boot_loader_config(boot_loader: str | None) -> tuple[str, str]:
    """(file to edit, command that applies it) for a boot loader; GRUB when unknown."""
    if boot_loader == "systemd-boot":
        return "/etc/kernel/cmdline", "proxmox-boot-tool refresh"
    return "/etc/default/grub", "update-grub"


def rebuild_initramfs_holding(module: str, boot: str = "/boot") -> str:
    """The shell step that rebuilds every initramfs in ``boot`` that holds ``module``, or
    that ``lsinitramfs`` cannot list (``update-initramfs -u -k VERSION`` each), and no
    other: blacklisting a module matters at boot only where an initramfs can load it
    before the root file system's modprobe.d is read; an image without it (MODULES=dep,
    no plymouth) boots the same rebuilt or not, and the rebuild is the slowest step of a
    deploy on a small host. ``lsinitramfs`` (initramfs-tools-core) lists every
    compression and early-microcode layout update-initramfs writes."""
    name = re.escape(module)
    images = f"{shlex.quote(boot.rstrip('/'))}/initrd.img-"
    return (f"held=; for img in {images}*; do [ -e \"$img\" ] || continue; "
            "if ! listing=$(lsinitramfs \"$img\" 2>/dev/null) || printf '%s\\n' \"$listing\" "
            f"| grep -Eq '/{name}\\.ko(\\.[a-z]+)?$'; then held=1; "
            f"update-initramfs -u -k \"${{img#{images}}}\" || exit 1; fi; done; "
            f"[ -n \"$held\" ] || echo 'no initramfs holds {module}: none rebuilt'")
