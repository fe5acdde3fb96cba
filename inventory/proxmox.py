"""Example inventory for the Proxmox VE host that passes the GPUs to the guest.

    pyinfra inventory/proxmox.py deploy/hypervisor.py --dry
    pyinfra inventory/proxmox.py deploy/hypervisor.py

Binds the GPUs to vfio-pci, turns the IOMMU on and configures VM ``proxmox_vmid``
through ``qm`` (q35, OVMF, cpu host, hostpciN pcie=1 with explicit .0 functions, the
64-bit MMIO window, the P2P clique args), setting only what differs. With
``proxmox_ctid`` instead, an LXC container gets the GPUs' device nodes bound in and the
host keeps its NVIDIA driver (no IOMMU, no vfio-pci). Keys are
documented in roles/kernel and roles/proxmox DEFAULTS. Keep host-key checking on.
"""

proxmox = [
    (
        "pve1",
        {
            "ssh_hostname": "10.0.0.2",
            "ssh_user": "root",
            "ssh_key": "~/.ssh/id_ed25519",
            "ssh_known_hosts_file": "~/.ssh/known_hosts",
            "ssh_strict_host_key_checking": "yes",
            "proxmox_vmid": 101,  # the guest inventory/gpu.py describes
            # or "proxmox_ctid": 120 (and no proxmox_vmid): an LXC container instead
            # None = every NVIDIA GPU the host's sysfs shows (in address order); or list
            # them: ["0000:01:00.0", "0000:21:00.0", ...] (explicit .0 function).
            "proxmox_gpus": None,
            "proxmox_vfio_ids": None,  # None = the GPUs' ids (+ their audio functions)
            "proxmox_mmio_window_mb": None,  # None = sized from the BARs (8x 128 GiB -> 2 TiB)
            # Put all GPUs in P2P clique 0 only if the host path between them supports
            # P2P (same root complex / switch); None leaves the clique args out.
            "proxmox_gpudirect_clique": 0,
            "pci_noacs": False,  # pci=noacs on the host if ACS redirection hangs NCCL
            "allow_reboot": False,  # the hypervisor runs other guests: reboot by hand
            "proxmox_restart_vm": False,
        },
    ),
]
