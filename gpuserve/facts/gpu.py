"""pyinfra facts about NVIDIA GPUs, driver and CUDA toolkit.

Usage: ``host.get_fact(NvidiaGpus)``; on the CLI
``pyinfra inventory/gpu.py fact gpuserve.facts.gpu.NvidiaGpus``.
"""

from __future__ import annotations

from typing import Any

from pyinfra.api import FactBase

from gpuserve.facts.base import ParsedFact, print_file, quiet
from gpuserve.parsers import cuda, nvidia_driver, nvidia_smi
from gpuserve.parsers.sections import marker, split_sections

P2P_MODES = ("r", "w", "n", "a", "p")

# Package-name prefixes worth listing for the driver fact (dpkg-query ${Package}).
_DRIVER_PACKAGE_RE = (
    "^(nvidia|cuda-drivers|libnvidia-compute|linux-modules-nvidia|linux-objects-nvidia)"
)

NVIDIA_DRIVER_COMMAND = (
    f"if [ -r /proc/driver/nvidia/version ]; then echo '{marker('proc')}'; "
    f"{print_file('/proc/driver/nvidia/version')}; fi; "
    f"if command -v dpkg-query >/dev/null 2>&1; then echo '{marker('dpkg')}'; "
    "dpkg-query -W -f='${db:Status-Abbrev}\\t${Package}\\t${Version}\\n' 2>/dev/null"
    f" | awk -F'\\t' '$1 ~ /^.i/ && $2 ~ /{_DRIVER_PACKAGE_RE}/'; fi; true"
)

CUDA_TOOLKIT_COMMAND = (
    "if [ -r /usr/local/cuda/version.json ]; then "
    f"{print_file('/usr/local/cuda/version.json')}; "
    f"elif [ -r /usr/local/cuda/version.txt ]; then {print_file('/usr/local/cuda/version.txt')}; "
    "elif [ -x /usr/local/cuda/bin/nvcc ]; then /usr/local/cuda/bin/nvcc --version; "
    "elif command -v nvcc >/dev/null 2>&1; then nvcc --version; fi; true"
)


class NvidiaGpus(ParsedFact[list[nvidia_smi.GpuInfo]]):
    """The GPUs nvidia-smi sees (index, name, uuid, bus_id, memory_total_mib,
    driver_version, compute_cap, persistence_mode); empty without nvidia-smi or a
    loaded driver.
    """

    default = list

    def requires_command(self) -> str:
        return "nvidia-smi"

    def command(self) -> str:
        return quiet(nvidia_smi.QUERY_COMMAND)

    def parse(self, output: list[str]) -> list[nvidia_smi.GpuInfo]:
        return nvidia_smi.parse_query_gpu(output)


class NvidiaTopology(ParsedFact[dict[str, Any] | None]):
    """``nvidia-smi topo -m`` as ``{"gpus", "links", "nic_links", "nics", "cpu_affinity",
    "numa_affinity", "gpu_numa_id"}`` (links: GPU x GPU matrix of X/PHB/SYS/NV#...)."""

    def requires_command(self) -> str:
        return "nvidia-smi"

    def command(self) -> str:
        return quiet("nvidia-smi topo -m")

    def parse(self, output: list[str]) -> dict[str, Any] | None:
        return nvidia_smi.parse_topo_matrix(output).to_json()


class NvidiaP2P(ParsedFact[dict[str, Any] | None]):
    """``nvidia-smi topo -p2p <mode>`` as ``{"gpus", "cells"}``; mode r (read),
    w (write), n (nvlink), a (atomics) or p (pcie)."""

    def requires_command(self, mode: str = "r") -> str:
        return "nvidia-smi"

    def command(self, mode: str = "r") -> str:
        if mode not in P2P_MODES:
            raise ValueError(f"NvidiaP2P mode must be one of {', '.join(P2P_MODES)}, not {mode!r}")
        return quiet(f"nvidia-smi topo -p2p {mode}")

    def parse(self, output: list[str]) -> dict[str, Any] | None:
        return nvidia_smi.parse_p2p_matrix(output).to_json()


def driver_from_sections(sections: dict[str, list[str]]) -> dict[str, Any]:
    """Driver fact value from the ``proc`` and ``dpkg`` sections of the gathered text.

    The loaded module's banner is the truth when present; otherwise (module not loaded,
    e.g. reboot pending, or no kernel module at all) the installed packages say which
    flavour will load. Each piece of evidence that does not parse is left out.
    """
    result: dict[str, Any] = {"version": None, "flavour": None, "packages": {}, "loaded": False}
    if "dpkg" in sections:
        try:
            result["packages"] = nvidia_driver.parse_dpkg_installed(sections["dpkg"])
        except ValueError:
            result["packages"] = {}
    banner = None
    if sections.get("proc"):
        try:
            banner = nvidia_driver.parse_proc_version(sections["proc"])
        except ValueError:
            banner = None
    if banner is not None:
        result.update(version=banner["version"], flavour=banner["flavour"], loaded=True)
    else:
        result["version"] = nvidia_driver.driver_version_from_packages(result["packages"])
        result["flavour"] = nvidia_driver.flavour_from_packages(result["packages"])
    return result


class NvidiaDriver(FactBase[dict[str, Any]]):
    """``{"version", "flavour", "packages", "loaded"}``: the loaded module's version and
    flavour ("open" / "proprietary") from /proc/driver/nvidia/version, else those of the
    installed kernel-module package; ``packages`` maps installed NVIDIA package names
    to versions; ``loaded`` says whether a module banner was read.
    """

    @staticmethod
    def default() -> dict[str, Any]:
        return {"version": None, "flavour": None, "packages": {}, "loaded": False}

    def command(self) -> str:
        return NVIDIA_DRIVER_COMMAND

    def process(self, output: list[str]) -> dict[str, Any]:
        return driver_from_sections(split_sections(output))


class CudaToolkit(ParsedFact[str | None]):
    """CUDA toolkit lane of /usr/local/cuda (or nvcc on PATH), e.g. "13.0"; None if none."""

    def command(self) -> str:
        return CUDA_TOOLKIT_COMMAND

    def parse(self, output: list[str]) -> str | None:
        return cuda.parse_toolkit(output)


class NvidiaFabric(ParsedFact[list[nvidia_smi.FabricInfo] | None]):
    """Each GPU's fabric registration (``fabric.state``, ``fabric.status``: the State and
    Status of ``nvidia-smi -q``'s Fabric block, "N/A" on GPUs without one), through the
    query form: a fraction of ``-q``'s time, and empty on drivers without the fields."""

    def requires_command(self) -> str:
        return "nvidia-smi"

    def command(self) -> str:
        return quiet(nvidia_smi.FABRIC_QUERY_COMMAND)

    def parse(self, output: list[str]) -> list[nvidia_smi.FabricInfo] | None:
        return nvidia_smi.parse_fabric_query(output)


class NvswitchDevices(FactBase[list[str]]):
    """The entries of /proc/driver/nvidia-nvswitch/devices (one per NVSwitch the loaded
    driver manages; NVIDIA/gpu-driver-container's test for Fabric Manager)."""

    default = list

    def command(self) -> str:
        return ("for d in /proc/driver/nvidia-nvswitch/devices/*; do "
                "[ -e \"$d\" ] && echo \"${d##*/}\"; done; true")

    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if line.strip()]
