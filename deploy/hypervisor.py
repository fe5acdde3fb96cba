"""Prepare a Proxmox VE host for GPU passthrough: IOMMU, vfio-pci, the VM's config.

    pyinfra inventory/proxmox.py deploy/hypervisor.py --dry
    pyinfra inventory/proxmox.py deploy/hypervisor.py

Host data is validated first (gpuserve.host_data); GPU addresses, vfio ids and the
MMIO window default to what the host's sysfs shows (roles.proxmox.DEFAULTS).
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyinfra import host
from pyinfra.api.exceptions import PyinfraError

from gpuserve.errors import GpuserveError
from gpuserve.host_data import hypervisor_settings
from roles import kernel, proxmox


def inventory_source() -> str:
    for arg in sys.argv[1:]:
        path = Path(arg)
        if path.suffix == ".py" and path.stem in host.groups and path.is_file():
            return str(arg)
    return f"inventory (host {host.name})"


def host_data(*defaults: dict) -> dict:
    merged: dict = {}
    for layer in defaults:
        merged.update(layer)
    merged.update({k: v for k, v in host.data.dict().items() if k in merged})
    return merged


def main() -> None:
    source = inventory_source()
    settings = hypervisor_settings(host_data(kernel.DEFAULTS, proxmox.DEFAULTS), source)
    gpus, vfio_ids, mmio_mb = proxmox.resolve(
        source, settings.gpus, settings.vfio_ids, settings.mmio_window_mb
    )
    params = settings.kernel.params(*kernel.platform())

    kernel.configure_kernel(params=params)
    proxmox.bind_vfio(vfio_ids=vfio_ids)
    proxmox.configure_vm(
        vmid=settings.vmid,
        gpus=gpus,
        mmio_mb=mmio_mb,
        clique=settings.clique,
        restart=settings.kernel.allow_reboot and settings.restart_vm,
    )
    kernel.activate_kernel(
        params=params,
        allow_reboot=settings.kernel.allow_reboot,
        reboot_timeout=settings.kernel.reboot_timeout,
    )


try:
    main()
except GpuserveError as exc:
    raise PyinfraError(f"gpuserve: {exc}") from None
