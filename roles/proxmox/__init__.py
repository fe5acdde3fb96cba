"""Proxmox VE host: GPUs bound to vfio-pci and a VM configured to receive them.

configure: vfio-pci binding by vendor:device id (/etc/modprobe.d/vfio.conf, the vfio
modules in /etc/modules, initramfs rebuilt when either changes); the VM's config through
``qm`` (q35, OVMF, cpu host without hidden=1, hostpciN with pcie=1 and an explicit .0
function, a 64-bit MMIO window sized for the GPUs' BARs, the P2P clique args).
The VM step reads ``qm config <vmid>`` first and sets only the keys that differ
(decisions in gpuserve.host.passthrough). IOMMU parameters come from gpuserve.roles.kernel.
Sources: Proxmox VE admin guide, "PCI(e) Passthrough" and qm(1).
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import StringCommand, deploy, operation
from pyinfra.facts.server import Command
from pyinfra.operations import files, server

from gpuserve.errors import InputError
from gpuserve.host import defaults as host_defaults
from gpuserve.host import passthrough
from gpuserve.paths import TEMPLATES_DIR

TEMPLATES = TEMPLATES_DIR  # templates/ of the checkout, or gpuserve/templates installed

DEFAULTS = host_defaults.PROXMOX


def pci_functions() -> list[passthrough.PciFunction]:
    output = host.get_fact(Command, command=passthrough.SYSFS_PCI_COMMAND) or ""
    return passthrough.parse_sysfs_pci(output)


def resolve(
    src: str,
    gpus: list[str] | None,
    vfio_ids: list[str] | None,
    mmio_mb: int | None,
) -> tuple[list[str], list[str], int]:
    """Fill what host data left out from the host's sysfs; InputError when impossible."""
    functions = pci_functions()
    found, found_ids = passthrough.gpus_and_companions(functions)
    by_address = {f.address: f for f in functions}
    if gpus is None:
        if not found:
            raise InputError(src, "proxmox_gpus", f"no NVIDIA GPU found in sysfs on {host.name}; "
                             "list the GPUs' PCI addresses")
        gpus = [f.address for f in found]
    if vfio_ids is None:
        if not found_ids:
            raise InputError(src, "proxmox_vfio_ids", f"no NVIDIA GPU found in sysfs on "
                             f"{host.name}; give the vendor:device ids to bind")
        vfio_ids = found_ids
    if mmio_mb is None:
        bars = [by_address[g].bars for g in gpus if g in by_address and by_address[g].bars]
        if len(bars) != len(gpus):
            raise InputError(src, "proxmox_mmio_window_mb", "cannot read the GPUs' BAR sizes "
                             f"from sysfs on {host.name}; give the window in MiB")
        mmio_mb = passthrough.mmio_window_mb(bars)
    return gpus, vfio_ids, mmio_mb


@operation()
def vm_config(vmid: int, gpus: list[str], mmio_mb: int | None, clique: int | None,
              restart: bool = False):
    """``qm set`` with only the keys whose current value differs."""
    text = host.get_fact(Command, command=f"qm config {int(vmid)}") or ""
    changes = passthrough.desired_vm_changes(
        passthrough.parse_qm_config(text), gpus, mmio_mb, clique
    )
    if not changes:
        host.noop(f"VM {vmid} already configured for {len(gpus)} GPU(s)")
        return
    logger.info(f"{host.name}: VM {vmid}: setting {', '.join(sorted(changes))}")
    current = passthrough.parse_qm_config(text)
    if changes.get("bios") == "ovmf" and "efidisk0" not in current:
        # OVMF keeps its variables on an EFI disk; without one qm starts the VM with a
        # temporary efivars disk ("no efidisk configured!"), losing boot entries.
        logger.warning(f"{host.name}: VM {vmid} has no efidisk0: add one, e.g. "
                       f"qm set {int(vmid)} --efidisk0 <storage>:1,efitype=4m")
    yield StringCommand(passthrough.qm_set_command(vmid, changes))
    yield from restart_if_running(f"VM {vmid}", f"qm status {int(vmid)}",
                                  f"qm stop {int(vmid)} && qm start {int(vmid)}", restart)


def restart_if_running(guest: str, status_command: str, restart_command: str,
                       restart: bool):
    """After a guest's config changed: restart it when it runs and ``restart`` is set,
    else say that the change waits for its next start (a VM's or container's config is
    read when it starts)."""
    status = host.get_fact(Command, command=status_command) or ""
    if "running" not in status:
        return
    if restart:
        yield StringCommand(restart_command)
    else:
        logger.warning(f"{host.name}: {guest} is running: its new config applies at its "
                       "next start (or set proxmox_restart_vm=True)")


@deploy("vfio-pci binding")
def bind_vfio(vfio_ids: list[str]):
    conf = files.template(
        name=f"vfio-pci owns {', '.join(vfio_ids)}",
        src=str(TEMPLATES / "proxmox-vfio.conf.j2"),
        dest="/etc/modprobe.d/vfio.conf",
        mode="644",
        ids=vfio_ids,
    )
    modules = [
        files.line(name=f"Load {m} at boot", path="/etc/modules", line=f"^{m}$", replace=m)
        for m in passthrough.VFIO_MODULES
    ]
    server.shell(
        name="Rebuild every initramfs with vfio",
        commands=["update-initramfs -u -k all"],
        _if=[lambda: conf.did_change() or any(op.did_change() for op in modules)],
    )


@deploy("Proxmox VM for GPU passthrough")
def configure_vm(vmid: int, gpus: list[str], mmio_mb: int | None, clique: int | None,
                 restart: bool = False):
    vm_config(
        name=f"VM {vmid}: q35, OVMF, cpu host, {len(gpus)} GPU(s), MMIO {mmio_mb} MiB",
        vmid=vmid,
        gpus=gpus,
        mmio_mb=mmio_mb,
        clique=clique,
        restart=restart,
    )
