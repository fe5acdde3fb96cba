"""The hypervisor deploy: a Proxmox VE host prepared to give its GPUs to a guest, a VM
(passthrough) or an LXC container (sharing the host's driver). Called by
deploy/hypervisor.py, or by a pyinfra project's own deploy file.
"""

from __future__ import annotations

from gpuserve.host.host_data import hypervisor_settings
from gpuserve.roles import kernel, proxmox
from gpuserve.roles.base.inventory import host_data, inventory_source, packaged_deploy
from gpuserve.roles.proxmox import container


@packaged_deploy
def proxmox_hypervisor() -> None:
    """Host data is validated first (``gpuserve.host.host_data``); GPU addresses, vfio
    ids and the MMIO window default to what the host's sysfs shows
    (``gpuserve.roles.proxmox.DEFAULTS``); ``proxmox_ctid`` instead of ``proxmox_vmid``
    takes the container path."""
    source = inventory_source()
    settings = hypervisor_settings(host_data(kernel.DEFAULTS, proxmox.DEFAULTS), source)
    if settings.ctid is not None:
        container.check(settings.ctid, source)
        container.configure_container(ctid=settings.ctid, restart=settings.restart_vm)
        return
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
