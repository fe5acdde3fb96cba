"""CUDA toolkit lane (12.8 / 12.9 / 13.0) from NVIDIA's CUDA repository.

The lane must run on the pinned driver branch (CUDA release notes, Table 3); a lane the
branch cannot run is refused before anything changes. ``cuda-toolkit-X-Y`` installs the
toolkit only, never a driver (``cuda-X-Y`` would pull ``cuda-drivers`` and break the
pin). The installed lane is what deploy/serve.py later reads (fact CudaToolkit) to pick
the SGLang release (12.x -> 0.5.19, 13.x -> 0.5.23).
"""

from __future__ import annotations

from pathlib import Path

from pyinfra import host
from pyinfra.api import StringCommand, deploy, operation
from pyinfra.facts.server import Command
from pyinfra.operations import apt, files

from gpuserve.host import driver

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"

DEFAULTS = {
    # CUDA toolkit lane to install: "12.8", "12.9" or "13.0" (gpuserve/data/host/nvidia.yaml).
    "cuda_lane": "13.0",
}


def _gpu_facts():
    from gpuserve.facts import gpu as gpu_facts

    return gpu_facts


def preflight(lane: str, branch: int) -> None:
    """Refuse a lane the branch, or an already installed older driver, cannot run."""
    installed = (host.get_fact(_gpu_facts().NvidiaDriver) or {}).get("version")
    problem = driver.lane_problem(lane, branch, installed)
    if problem:
        raise driver.HostRefusal(f"{host.name}: cuda_lane {lane} refused: {problem}")


@operation()
def cuda_alternative(lane: str):
    """Point /usr/local/cuda at the lane (cuda-toolkit packages register it as the
    ``cuda`` alternative; a second installed lane may otherwise keep the link)."""
    target = f"/usr/local/cuda-{lane}"
    current = host.get_fact(Command, command="readlink -f /usr/local/cuda || true") or ""
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
    apt.packages(name=f"CUDA {lane} toolkit ({package})", packages=[package])
    cuda_alternative(name=f"/usr/local/cuda is CUDA {lane}", lane=lane)
    files.template(
        name=f"CUDA {lane} on PATH",
        src=str(TEMPLATES / "nvidia-cuda-profile.sh.j2"),
        dest="/etc/profile.d/gpuserve-cuda.sh",
        mode="644",
        lane=lane,
    )
