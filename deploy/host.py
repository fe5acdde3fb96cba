"""Provision a GPU host: kernel parameters, NVIDIA driver, CUDA lane, NCCL env, reboot.

    pyinfra inventory/gpu.py deploy/host.py --dry   # the plan
    pyinfra inventory/gpu.py deploy/host.py         # apply

Host data is validated first (gpuserve.host.host_data) so a bad value stops the run with
``<inventory>: <key>: ...`` before any host is changed; the keys and their defaults are
documented in each role's DEFAULTS.
"""

from __future__ import annotations

from gpuserve.host.host_data import host_settings
from roles import cuda_toolkit, kernel, nccl, nvidia_driver
from roles.inventory import host_data, inventory_source, run_deploy


def main() -> None:
    data = host_data(kernel.DEFAULTS, nvidia_driver.DEFAULTS, cuda_toolkit.DEFAULTS, nccl.DEFAULTS)
    settings = host_settings(data, inventory_source())
    params = settings.kernel.params(*kernel.platform())

    kernel.configure_kernel(params=params)
    nvidia_driver.install_nvidia_driver(
        repo_url=settings.repo_url,
        branch=settings.branch,
        flavour=settings.flavour,
        mok_enrolled=settings.mok_enrolled,
        install_headers=settings.install_headers,
        contrib=settings.debian_contrib,
        persistence=settings.persistence,
    )
    cuda_toolkit.install_cuda_toolkit(lane=settings.cuda_lane, branch=settings.branch)
    nccl.configure_nccl(overrides=settings.nccl_overrides)
    kernel.activate_kernel(
        params=params,
        allow_reboot=settings.kernel.allow_reboot,
        reboot_timeout=settings.kernel.reboot_timeout,
    )


run_deploy(main)
