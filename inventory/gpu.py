"""Example inventory for a real GPU host: one Proxmox guest with the reference box.

    pyinfra inventory/gpu.py deploy/host.py --dry    # the plan
    pyinfra inventory/gpu.py deploy/host.py          # provision (driver, CUDA, IOMMU, NCCL)
    pytest tests/host --inventory inventory/gpu.py   # prove it
    pyinfra inventory/gpu.py deploy/serve.py         # serve

Copy this file and edit the address, user, key and data. Host-key checking stays on
(``yes``): add the host to your known_hosts first (``ssh-keyscan -t ed25519 ADDR``,
then compare the fingerprint with the host's console). Every key below is documented
once in the DEFAULTS of roles/kernel, roles/nvidia_driver, roles/cuda_toolkit and
roles/nccl; leave a key out to take its default.
"""

import os

gpu = [
    (
        "gpu1",  # 8x RTX PRO 6000 Blackwell Server Edition in a Proxmox/KVM guest (q35, OVMF)
        {
            # -- how pyinfra and tests/host reach it --
            "ssh_hostname": "10.0.0.21",
            "ssh_user": "root",
            "ssh_key": "~/.ssh/id_ed25519",
            "ssh_known_hosts_file": "~/.ssh/known_hosts",
            "ssh_strict_host_key_checking": "yes",
            # -- deploy/host.py --
            # NVIDIA's repository; point at a local mirror of .../repos/debian12/x86_64/
            # for air-gapped hosts. None = NVIDIA's own URL for the host's distribution.
            "nvidia_repo_url": None,
            # A mirror must be https, unless listed here as a prefix you vouch for, e.g.
            # ["http://10.0.0.5:8000/"] (also what pip_index_url / pip_find_links use).
            "trusted_mirrors": [],
            # sha256 of the mirror's cuda-keyring_1.1-1_all.deb; None = the digest NVIDIA
            # publishes for the host's distribution (gpuserve/data/host/nvidia.yaml).
            "nvidia_keyring_sha256": None,
            "nvidia_driver_branch": 580,  # CUDA 13.0 needs >= 580.65.06
            "nvidia_driver_flavour": "open",  # Blackwell runs only the open modules
            "cuda_lane": "13.0",  # 12.x -> SGLang 0.5.19, 13.x -> 0.5.23 in deploy/serve.py
            "iommu_passthrough": True,  # iommu=pt
            "pci_noacs": False,  # ACS only matters on the hypervisor / bare metal
            # A guest: the boot loader change needs a reboot; let the deploy do it.
            "allow_reboot": True,
            # The guest has no P2P (CNS): the derived env sets NCCL_P2P_DISABLE=1; add
            # overrides here, e.g. {"NCCL_DEBUG": "WARN"}.
            "nccl_env": {},
            # -- deploy/serve.py --
            "profile": "glm5-nvfp4-tp8",
            # Secrets come from the controller's environment, never from this file.
            "hf_token": os.environ.get("HF_TOKEN"),
            "sglang_api_key": os.environ.get("SGLANG_API_KEY"),
        },
    ),
]
