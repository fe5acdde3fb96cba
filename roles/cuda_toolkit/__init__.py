"""CUDA toolkit lane (12.8 / 12.9 / 13.0) from NVIDIA's CUDA repository.

The lane must run on the pinned driver branch (CUDA release notes, Table 3); a lane the
branch cannot run is refused before anything changes. ``cuda-toolkit-X-Y`` installs the
toolkit only, never a driver (``cuda-X-Y`` would pull ``cuda-drivers`` and break the
pin). The installed lane is what deploy/serve.py later reads (fact CudaToolkit) to pick
the SGLang release (12.x -> 0.5.19, 13.x -> 0.5.23).
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import StringCommand, deploy, operation
from pyinfra.facts.server import Command

from gpuserve.host import defaults as host_defaults
from gpuserve.host import driver
from gpuserve.paths import TEMPLATES_DIR
from gpuserve.roles.base import managed, planned
from gpuserve.roles.base.prefetch import Read, fact, fact_if_unchanged

TEMPLATES = TEMPLATES_DIR  # templates/ of the checkout, or gpuserve/templates installed

DEFAULTS = host_defaults.CUDA_TOOLKIT


def _gpu_facts():
    from gpuserve.facts import gpu as gpu_facts

    return gpu_facts


PROFILE = "/etc/profile.d/gpuserve-cuda.sh"
CUDA_LINK = "readlink -f /usr/local/cuda || true"


def reads(lane: str) -> list[Read]:
    """Everything this role reads, for the deploy's prefetch (roles/base/prefetch.py)."""
    return [Read.of(_gpu_facts().NvidiaDriver), Read.of(Command, command=CUDA_LINK),
            managed.read(PROFILE), managed.read_package(driver.lanes()[lane]["package"])]


def preflight(lane: str, branch: int) -> None:
    """Refuse a lane the branch, or an already installed older driver, cannot run."""
    installed = (fact(_gpu_facts().NvidiaDriver) or {}).get("version")
    problem = driver.lane_problem(lane, branch, installed)
    if problem:
        raise driver.HostRefusal(f"{host.name}: cuda_lane {lane} refused: {problem}")


@operation()
def cuda_alternative(lane: str):
    """Point /usr/local/cuda at the lane (cuda-toolkit packages register it as the
    ``cuda`` alternative; a second installed lane may otherwise keep the link)."""
    target = f"/usr/local/cuda-{lane}"
    # read at execute time: after the toolkit package (unless nothing changes)
    current = fact_if_unchanged(Command, command=CUDA_LINK) or ""
    if current.strip() == target:
        host.noop(f"/usr/local/cuda -> {target}")
        return
    yield StringCommand(
        f"update-alternatives --set cuda {target} || ln -sfn {target} /usr/local/cuda"
    )


@deploy("CUDA toolkit")
def install_cuda_toolkit(lane: str, branch: int):
    preflight(lane, branch)
    package = driver.lanes()[lane]["package"]
    managed.packages(name=f"CUDA {lane} toolkit ({package})", packages=[package])
    if (fact(Command, command=CUDA_LINK) or "").strip() != f"/usr/local/cuda-{lane}":
        planned.action(f"point /usr/local/cuda at /usr/local/cuda-{lane}")
    cuda_alternative(name=f"/usr/local/cuda is CUDA {lane}", lane=lane)
    managed.put(
        name=f"CUDA {lane} on PATH",
        text=managed.render(TEMPLATES / "nvidia-cuda-profile.sh.j2", lane=lane),
        dest=PROFILE, user="root", group="root", mode="644",
    )
