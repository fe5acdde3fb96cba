"""Prepare a Proxmox VE host to give its GPUs to a guest: a VM through passthrough
(IOMMU, vfio-pci, the VM's config) or an LXC container sharing the host's driver (the
container's device cgroup and bind mounts only).

    pyinfra inventory/proxmox.py deploy/hypervisor.py --dry
    pyinfra inventory/proxmox.py deploy/hypervisor.py

Host data is validated first (gpuserve.host.host_data); GPU addresses, vfio ids and the
MMIO window default to what the host's sysfs shows (gpuserve.roles.proxmox.DEFAULTS);
``proxmox_ctid`` instead of ``proxmox_vmid`` takes the container path. The deploy is
``gpuserve.roles.deploys.proxmox_hypervisor`` (docs/deploys.md).
"""

from gpuserve.roles.deploys import proxmox_hypervisor

proxmox_hypervisor()
