"""Provision a GPU host: kernel parameters, NVIDIA driver, CUDA lane, NCCL env, reboot.

    pyinfra inventory/gpu.py deploy/host.py --dry   # the plan
    pyinfra inventory/gpu.py deploy/host.py         # apply

The measuring stage (roles/gpu_gates) runs last, here rather than in a deploy of its
own: it must measure the host as provisioned (after the kernel parameters and a reboot
took effect), and its choice rewrites nccl.env and host.json, which this deploy owns;
a second deploy would make two writers of one file and a host that is "provisioned"
before anyone measured it. ``gates: off`` in host data skips it.

On a container host (``systemd-detect-virt --container``: a Proxmox LXC container, say)
the kernel is the container host's: the deploy installs the userspace driver of exactly
its kernel module's version and skips the kernel's steps, saying why for each
(roles/nvidia_driver/userspace.py, gpuserve/host/container.py).

Host data is validated first (gpuserve/host/plan.py, the same code ``gpuserve check``
runs without connecting) so a bad value stops the run with
``<inventory>: <key>: ...`` before any host is changed; the keys and their defaults are
documented in each role's DEFAULTS.
"""

from __future__ import annotations

from pyinfra import host

from gpuserve.facts.host import Container
from gpuserve.host.plan import plan_host
from gpuserve.roles import cuda_toolkit, gpu_gates, kernel, nccl, nvidia_driver
from gpuserve.roles.inventory import inventory_source, run_deploy
from gpuserve.roles.nvidia_driver import userspace
from gpuserve.roles.prefetch import defer, fact, prefetch


def main() -> None:
    settings = plan_host(host.data.dict(), inventory_source())  # also run by gpuserve check
    # every read of the roles below in one remote command (roles/prefetch.py); the driver
    # role adds its files and packages once it knows the repository
    prefetch([*kernel.reads(), *nvidia_driver.fact_reads(),
              *cuda_toolkit.reads(settings.cuda_lane), *nccl.reads(),
              *gpu_gates.reads(settings.gates)])
    # the measuring tools' build stamps are named after the NCCL this batch found: they
    # join the driver role's second batch instead of costing a command each
    defer(gpu_gates.stamp_reads(settings.gates))
    container = fact(Container)
    if container:
        plan, url, sha256 = userspace.prepare(settings.repo_url, container)
        userspace.install_userspace_driver(plan=plan, url=url, sha256=sha256,
                                           container_kind=container,
                                           contrib=settings.debian_contrib)
        provision_userspace(settings, plan.branch)
        return
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
    measure(settings)


def provision_userspace(settings, branch: int) -> None:
    """A container host's steps after its driver: the CUDA lane (checked against the
    branch of the host's kernel module), NCCL, the measurement."""
    cuda_toolkit.install_cuda_toolkit(lane=settings.cuda_lane, branch=branch)
    nccl.configure_nccl(overrides=settings.nccl_overrides)
    measure(settings)


def measure(settings) -> None:
    gpu_gates.measure_gpu_gates(settings=settings.gates,
                                nccl_overrides=settings.nccl_overrides,
                                results_dir=settings.results_dir)


run_deploy(main)
