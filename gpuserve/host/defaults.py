"""The host deploy's host data and defaults, one dict per role (roles/kernel,
roles/nvidia_driver, roles/cuda_toolkit, roles/nccl, roles/gpu_gates, roles/proxmox export
each as their ``DEFAULTS``); each key's comment documents it. Read by
:mod:`gpuserve.plans.host` (and ``gpuserve check`` for hypervisors).
"""

from __future__ import annotations

#: roles/kernel
KERNEL = {
    # Add iommu=pt: host-owned devices bypass DMA translation; NVIDIA documents P2P copies
    # through a translating IOMMU as unsupported on PCIe bare metal.
    "iommu_passthrough": True,
    # Add pci=noacs: stop ACS redirecting peer TLPs to the root complex (NVIDIA/nccl#2079).
    "pci_noacs": False,
    # Further kernel parameters the host must boot with (list of "k" or "k=v").
    # accepts: list[str]
    "kernel_extra_params": [],
    # Reboot the host when the running kernel lacks the configured parameters (or nouveau
    # is still loaded). Off: the deploy reports "REBOOT PENDING" and changes nothing else.
    "allow_reboot": False,
    # Seconds to wait for the host to come back after a reboot.
    "reboot_timeout": 900,
}


#: roles/nvidia_driver
NVIDIA_DRIVER = {
    # Base URL of NVIDIA's CUDA repository for this distribution (the directory holding
    # Packages and cuda-keyring_1.1-1_all.deb). None: NVIDIA's own,
    # https://developer.download.nvidia.com/compute/cuda/repos/<distro>/<arch>/.
    # accepts: str (a URL) or None
    "nvidia_repo_url": None,
    # sha256 of cuda-keyring_1.1-1_all.deb as that repository serves it. None: the value
    # published for the host's distribution (gpuserve/data/host/nvidia.yaml); a mirror
    # that builds its own keyring, or a distribution the table lacks, must set it.
    # accepts: str (64 hex digits) or None
    "nvidia_keyring_sha256": None,
    # URL prefixes (e.g. "http://10.0.2.2:8000/") whose plain-http URLs host data may
    # use; every other URL must be https (gpuserve/host/mirrors.py).
    # accepts: list[str]
    "trusted_mirrors": [],
    # Driver branch to lock (580: versioned metas; 590+: nvidia-driver-pinning-<branch>).
    "nvidia_driver_branch": 580,
    # Kernel-module flavour: "open" (required on Blackwell) or "proprietary".
    "nvidia_driver_flavour": "open",
    # Secure Boot is on and a MOK is enrolled, so signed DKMS modules will load.
    "nvidia_secure_boot_mok_enrolled": False,
    # Install linux-headers for the running kernel (DKMS builds the modules against them).
    "nvidia_install_headers": True,
    # On Debian, add the contrib component to the distribution's sources.
    "nvidia_debian_contrib": True,
    # Run nvidia-persistenced in persistence mode.
    "nvidia_persistenced": True,
}


#: roles/fabric_manager
FABRIC_MANAGER = {
    # NVIDIA Fabric Manager (NVSwitch hosts: HGX/DGX A100, H100, H200, B200): "auto"
    # (installed where the host shows NVSwitches: docs/nvswitch.md), "on", "off".
    # accepts: str: auto, on or off (true/false: on/off)
    "fabric_manager": "auto",
    # Seconds to wait, after Fabric Manager starts, for every GPU's fabric registration.
    # accepts: int (10 to 3600)
    "fabric_wait_timeout": 180,
}


#: roles/cuda_toolkit
CUDA_TOOLKIT = {
    # CUDA toolkit lane to install: "12.8", "12.9" or "13.0" (gpuserve/data/host/nvidia.yaml).
    "cuda_lane": "13.0",
}


#: roles/nccl
NCCL = {
    # Overrides of the derived NCCL env, e.g. {"NCCL_DEBUG": "INFO"}; "" removes a key
    # (e.g. {"NCCL_P2P_DISABLE": ""} to keep P2P on in a VM with a P2P clique).
    # accepts: dict[str, str]
    "nccl_env": {},
}


#: roles/gpu_gates
GPU_GATES = {
    # Measuring stage after provisioning: "auto" (measure where nvidia-smi lists two or
    # more GPUs), "on" (and fail a host with fewer), "off".
    # accepts: str: auto, on or off (true/false: on/off)
    "gates": "auto",
    # Seconds one tool run may take before it is killed and counted as a hang.
    # accepts: int or float (seconds)
    "gates_timeout": 600,
    # Measure again although nothing the last measurement depends on changed.
    "gates_remeasure": False,
    # Per tool ("nccl-tests", "cuda-samples"): {url: mirror of the pinned source} or
    # {url: archive, sha256: its digest} (gpuserve/data/gates/sources.yaml).
    # accepts: dict[str, dict[str, str]]
    "gates_sources": {},
    # nccl-tests collectives: [all_reduce, all_gather, alltoall]; default: all_reduce, plus
    # all_gather and alltoall when host data's profile serves EP (gate_runs.gate_collectives)
    # accepts: list[str] or None
    "gates_collectives": None,
}



#: roles/rdma
RDMA = {
    # RDMA userspace, GPUDirect RDMA and the host record's "rdma" block: "auto" (where
    # the host has RDMA devices in /sys/class/infiniband), "on" (record an empty list
    # where none are found), "off".
    # accepts: str: auto, on or off (true/false: on/off)
    "rdma": "auto",
    # Seconds of perftest (ib_write_bw, then ib_write_lat) over each ACTIVE port to
    # itself after provisioning: a verbs smoke test, figures in the log and
    # /etc/gpuserve/rdma-loopback.json; 0 turns it off.
    # accepts: int (seconds, 0-60)
    "rdma_loopback": 0,
    # An inventory group whose hosts are measured between each other (each host with
    # the next: perftest's ib_write_bw and ib_write_lat, server on one, client on the
    # other, ACTIVE ports matched by position): figures in the log and each client's
    # /etc/gpuserve/rdma-pairs.json; None turns it off. Every host of the group runs
    # the host deploy in the same run, without --serial.
    # accepts: str (an inventory group) or None
    "rdma_pairs_group": None,
    # Seconds of ib_write_bw per matched port of a pair.
    # accepts: int (seconds, 1-60)
    "rdma_pairs_seconds": 5,
    # perftest's TCP port on the server host: port k of a pair uses this + 2k
    # (bandwidth) and + 2k + 1 (latency).
    # accepts: int (1024-65000)
    "rdma_pairs_port": 18515,
}

#: roles/proxmox (deploy/hypervisor.py; gpuserve check reads it for hypervisor hosts)
PROXMOX = {
    # The VM that receives the GPUs through vfio-pci passthrough (this or proxmox_ctid).
    # accepts: int (100..999999999) or None
    "proxmox_vmid": None,
    # Or the LXC container (pct) given the GPUs while the host's driver keeps them:
    # device cgroup and bind mounts only, no IOMMU, no vfio-pci (roles.proxmox.container).
    # accepts: int (100..999999999) or None
    "proxmox_ctid": None,
    # Full PCI function addresses of the GPUs, e.g. ["0000:01:00.0"]. None: every
    # NVIDIA VGA/3D function found in sysfs, in address order.
    # accepts: list[str] or None
    "proxmox_gpus": None,
    # vendor:device ids bound to vfio-pci. None: the GPUs' ids plus their HD-audio
    # functions' ids, read from sysfs.
    # accepts: list[str] or None
    "proxmox_vfio_ids": None,
    # OVMF 64-bit MMIO window in MiB. None: sized from the GPUs' 64-bit BARs in sysfs.
    # accepts: int or None
    "proxmox_mmio_window_mb": None,
    # x-nv-gpudirect-clique id given to every GPU (0-15), None to leave it out. Only put
    # GPUs in one clique when the host path between them really supports P2P.
    # accepts: int (0-15) or None
    "proxmox_gpudirect_clique": 0,
    # Restart the VM (qm stop/start) or container (pct reboot) when its config changed
    # so the change takes effect.
    "proxmox_restart_vm": False,
}
