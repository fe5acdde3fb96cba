"""Provision a GPU host: kernel parameters, NVIDIA driver, CUDA lane, NCCL env, reboot.

    pyinfra inventory/gpu.py deploy/host.py --dry   # the plan
    pyinfra inventory/gpu.py deploy/host.py         # apply

Host data is validated first (gpuserve.host_data) so a bad value stops the run with
``<inventory>: <key>: ...`` before any host is changed; the keys and their defaults are
documented in each role's DEFAULTS.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyinfra import host
from pyinfra.api.exceptions import PyinfraError

from gpuserve.errors import GpuserveError
from gpuserve.host_data import host_settings
from roles import cuda_toolkit, kernel, nccl, nvidia_driver


def inventory_source() -> str:
    """The inventory file this host came from (for error messages)."""
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


try:
    main()
except GpuserveError as exc:
    # Shown by pyinfra as one "pyinfra error" line instead of a traceback; raised at
    # prepare time, so no operation has run on any host.
    raise PyinfraError(f"gpuserve: {exc}") from None
