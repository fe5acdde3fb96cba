"""The host deploy: kernel parameters, NVIDIA driver, CUDA lane, NCCL env, reboot, and
the measured GPU gates last. Why the gates run here, and the container host's path:
docs/deploys.md. Called by deploy/host.py, or by a pyinfra project's own deploy file.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.facts.server import LinuxDistribution

from gpuserve.facts.host import Container
from gpuserve.host.driver import driver_plan, flavour_meta
from gpuserve.host.host_data import HostSettings
from gpuserve.host.proven import proven_on_host
from gpuserve.plans.host import plan_host
from gpuserve.roles import (
    cuda_toolkit,
    fabric_manager,
    gpu_gates,
    kernel,
    nccl,
    nvidia_driver,
    rdma,
)
from gpuserve.roles.base.inventory import inventory_source, packaged_deploy
from gpuserve.roles.base.prefetch import defer, fact, prefetch
from gpuserve.roles.base.preview import print_planned_preview
from gpuserve.roles.base.run_context import run_context
from gpuserve.roles.nvidia_driver import userspace
from gpuserve.roles.rdma import pairs as rdma_pairs


@packaged_deploy
def provision_gpu_host() -> None:
    """Provision this GPU host from ``host.data`` (the keys of the DEFAULTS of
    gpuserve.roles.kernel, nvidia_driver, cuda_toolkit, nccl and gpu_gates; ``gates:
    off`` skips the measurement). Host data is validated first (``plan_host``, what
    ``gpuserve check`` runs), so a bad value stops the run with ``<inventory>: <key>:
    ...`` before any host is changed. On a container host only the userspace driver of
    the kernel module's version is installed and the kernel's steps are skipped. Under
    ``--dry`` it prints what the run would change (roles/base/preview.py)."""
    provision(plan_host(host.data.dict(), inventory_source()))  # also run by gpuserve check
    run = run_context()
    if run.dry:  # what the real run would change; pyinfra stops after
        print_planned_preview(with_diff=run.diff, secrets=[])


def provision(settings: HostSettings) -> None:
    """The container host's steps, or :func:`provision_kernel_host`'s."""
    # every read of the roles below in one remote command (roles/base/prefetch.py); the driver
    # role adds its files and packages once it knows the repository
    prefetch([*kernel.reads(), *nvidia_driver.fact_reads(), *fabric_manager.reads(),
              *cuda_toolkit.reads(settings.cuda_lane), *nccl.reads(), *rdma.reads(),
              *gpu_gates.reads(settings.gates)])
    # the measuring tools' build stamps are named after the NCCL this batch found: they
    # join the driver role's second batch instead of costing a command each
    defer(gpu_gates.stamp_reads(settings.gates))
    # how this path is proven on the host's distribution (docs/hosts.md's matrix as data)
    release = (fact(LinuxDistribution) or {}).get("release_meta") or {}
    logger.info(f"{host.name}: {proven_on_host(release, 'host')}")
    container = fact(Container)
    if container:
        plan, url, sha256 = userspace.prepare(settings.repo_url, container,
                                              settings.keyring_sha256)
        fm = fabric_manager.decide(settings.fabric, plan.branch)
        fm_changed = fabric_manager.stale(fm, plan.deb_version)
        userspace.install_userspace_driver(plan=plan, url=url, sha256=sha256,
                                           container_kind=container,
                                           contrib=settings.debian_contrib, fm=fm)
        fabric_manager.activate(fm, fm_changed, settings.fabric.wait_timeout)
        # a container shares the host's kernel: userspace and record only, no module
        rdma.install_rdma(direct=rdma.plan(settings.rdma, settings.flavour, plan.branch),
                          kernel_host=False)
        provision_userspace(settings, plan.branch)
    else:
        provision_kernel_host(settings)
    # one call site for both paths: pyinfra's CLI orders operations by the lines of
    # their call stack, and a pair's server and client must be the same operations
    rdma_pairs.measure_pairs(settings.rdma_pairs)


def provision_kernel_host(settings: HostSettings) -> None:
    """A host with a kernel of its own: parameters, driver, CUDA lane, NCCL, the reboot
    the parameters need, the measurement."""
    params = settings.kernel.params(*kernel.platform())

    kernel.configure_kernel(params=params)
    fm = fabric_manager.decide(settings.fabric, settings.branch)
    change = nvidia_driver.installed_change(driver_plan(settings.branch, settings.flavour))
    fm_changed = nvidia_driver.fabric_moves(change, fm)
    nvidia_driver.install_nvidia_driver(nvidia_driver.DriverRequest(
        repo_url=settings.repo_url,
        branch=settings.branch,
        flavour=settings.flavour,
        mok_enrolled=settings.mok_enrolled,
        install_headers=settings.install_headers,
        contrib=settings.debian_contrib,
        persistence=settings.persistence,
        keyring_sha256=settings.keyring_sha256,
    ), fm=fm)
    cuda_toolkit.install_cuda_toolkit(lane=settings.cuda_lane, branch=settings.branch)
    direct = rdma.plan(settings.rdma, settings.flavour, settings.branch)
    rdma.install_rdma(direct=direct)  # before NCCL: its host.json carries the record
    nccl.configure_nccl(overrides=settings.nccl_overrides)
    kernel.activate_kernel(
        params=params,
        allow_reboot=settings.kernel.allow_reboot,
        reboot_timeout=settings.kernel.reboot_timeout,
        driver_package=flavour_meta(settings.flavour),
    )
    # after the reboot that loads the new module (FM refuses any other version) and
    # before anything uses CUDA (the measurement)
    fabric_manager.activate(fm, fm_changed, settings.fabric.wait_timeout)
    rdma.activate_gpudirect(direct)  # after the reboot that loads the new module
    rdma.measure_loopback(settings.rdma_loopback)
    measure(settings)


def provision_userspace(settings: HostSettings, branch: int) -> None:
    """A container host's steps after its driver: the CUDA lane (checked against the
    branch of the host's kernel module), NCCL, the measurement."""
    cuda_toolkit.install_cuda_toolkit(lane=settings.cuda_lane, branch=branch)
    nccl.configure_nccl(overrides=settings.nccl_overrides)
    rdma.measure_loopback(settings.rdma_loopback)
    measure(settings)


def measure(settings: HostSettings) -> None:
    gpu_gates.measure_gpu_gates(settings=settings.gates,
                                nccl_overrides=settings.nccl_overrides,
                                results_dir=settings.results_dir)
