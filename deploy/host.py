"""Provision a GPU host: kernel parameters, NVIDIA driver, CUDA lane, NCCL env, reboot.

    pyinfra inventory/gpu.py deploy/host.py --dry   # the plan
    pyinfra inventory/gpu.py deploy/host.py         # apply

The measuring stage (roles/gpu_gates) runs last; ``gates: off`` in host data skips it.
On a container host (a Proxmox LXC container, say) the deploy installs the userspace
driver of exactly its kernel module's version and skips the kernel's steps, saying why
for each. Host data is validated first, so a bad value stops the run with
``<inventory>: <key>: ...`` before any host is changed; the keys and their defaults are
documented in each role's DEFAULTS. Why the gates run here: docs/deploys.md (the deploy
is ``gpuserve.roles.deploys.provision_gpu_host``).
"""

from gpuserve.roles.deploys import provision_gpu_host

provision_gpu_host()
