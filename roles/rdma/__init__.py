"""RDMA: the verbs userspace, GPUDirect RDMA and the host's RDMA record.

Where the host has RDMA devices (host data ``rdma: auto``, the default) or is asked to
(``rdma: on``): installs the userspace of its distribution (rdma-core, ibverbs-utils,
perftest, infiniband-diags: gpuserve/data/host/rdma.yaml), chooses GPUDirect RDMA
(dma-buf, or the nvidia-peermem module loaded at boot: gpuserve.host.rdma.gpudirect)
and hands :func:`record` to the NCCL role, which writes it into
/etc/gpuserve/host.json as ``rdma`` (devices[] per port with state, link layer, GIDs,
NUMA node; the GPUs' NUMA nodes; the GPUDirect choice). Between hosts of a group:
roles/rdma/pairs.py.
"""

from __future__ import annotations

from typing import Any

from pyinfra import host
from pyinfra.api import FunctionCommand, StringCommand, deploy, operation
from pyinfra.facts.server import LinuxDistribution

from gpuserve.errors import InputError
from gpuserve.host import defaults as host_defaults
from gpuserve.host import rdma as rdma_host
from gpuserve.roles.base import managed, planned
from gpuserve.roles.base.prefetch import Read, fact

DEFAULTS = host_defaults.RDMA

PEERMEM_LOAD = "/etc/modules-load.d/gpuserve-nvidia-peermem.conf"


def _facts():
    from gpuserve.facts import rdma as rdma_facts

    return rdma_facts


def reads() -> list[Read]:
    """Everything this role reads, for the deploy's prefetch (roles/base/prefetch.py)."""
    packages = rdma_host.catalog()["packages"]["debian"]
    return [Read.of(_facts().RdmaDevices), Read.of(LinuxDistribution),
            managed.read(PEERMEM_LOAD), *(managed.read_package(p) for p in packages)]


def observed() -> dict[str, Any]:
    """The RDMA fact (ports, GPU NUMA nodes, kernel, peermem), empty when unread."""
    return fact(_facts().RdmaDevices) or {"ports": [], "gpu_numa": [], "kernel": None,
                                         "peermem_loaded": False}


def plan(mode: str, flavour: str, branch: int) -> rdma_host.GpuDirect | None:
    """The GPUDirect choice where this host gets RDMA, None where it does not."""
    seen = observed()
    if not rdma_host.wanted(mode, seen["ports"]):
        return None
    return rdma_host.gpudirect(flavour, branch, seen["kernel"])


#: host name -> the record :func:`install_rdma` chose (the NCCL role and the measuring
#: stage, which both write host.json, read it back through :func:`chosen_record`)
_CHOSEN: dict[str, dict[str, Any] | None] = {}


def record(direct: rdma_host.GpuDirect | None) -> dict[str, Any] | None:
    """host.json's ``rdma`` (None where this host gets no RDMA)."""
    if direct is None:
        return None
    seen = observed()
    return rdma_host.record(seen["ports"], seen["gpu_numa"], direct)


def chosen_record() -> dict[str, Any] | None:
    """This host's record as :func:`install_rdma` chose it; None before or without."""
    return _CHOSEN.get(host.name)


def record_of(name: str) -> dict[str, Any] | None:
    """Another host's record of this run (roles/rdma/pairs.py reads both ends of a
    pair at execute time, once every host has prepared); None outside the run."""
    return _CHOSEN.get(name)


@deploy("RDMA userspace")
def install_rdma(direct: rdma_host.GpuDirect | None, kernel_host: bool = True):
    """Install the userspace; for nvidia-peermem, load it at boot (modules-load.d)."""
    _CHOSEN[host.name] = record(direct)
    if direct is None:
        return
    distro = (fact(LinuxDistribution) or {}).get("release_meta", {}).get("ID")
    try:
        names = list(rdma_host.packages(distro))
    except ValueError as exc:
        raise InputError(host.name, "rdma", str(exc)) from exc
    managed.packages(name="RDMA userspace (verbs, perftest, diagnostics)", packages=names)
    if kernel_host and direct.method == "nvidia-peermem":
        managed.put(name="Load nvidia-peermem at boot", text="nvidia-peermem\n",
                    dest=PEERMEM_LOAD, user="root", group="root", mode="644")


@operation()
def load_peermem():
    if observed()["peermem_loaded"]:
        host.noop("nvidia-peermem is loaded")
        return
    yield StringCommand("modprobe nvidia-peermem")


def activate_gpudirect(direct: rdma_host.GpuDirect | None) -> None:
    """After the driver's reboot: load nvidia-peermem now where it was chosen."""
    if direct is None or direct.method != "nvidia-peermem":
        return
    if not observed()["peermem_loaded"]:
        planned.action("modprobe nvidia-peermem (GPUDirect RDMA)")
    load_peermem(name="GPUDirect RDMA: nvidia-peermem loaded")


def write_record(host, path: str, doc: dict) -> bool:
    """Write a measurement's JSON record on the host (root-owned, world-readable: it
    holds figures and device names, no secret)."""
    import json

    command = managed.write_command(path, json.dumps(doc, indent=2) + "\n",
                                    "root", "root", "644")
    ok, _ = host.run_shell_command(command, **command.connector_arguments)
    return ok


def _loopback(seconds: int, devices: list[dict]):
    """FunctionCommand body: run the loopback on each ACTIVE port, log the figures and
    write them to LOOPBACK_PATH; a port whose tools fail is named, the host not failed
    (the record and the doctor already say what is wrong with a port)."""

    def run(state, host) -> bool:  # noqa: ARG001 - pyinfra passes both by name
        results = []
        for device in devices:
            ok, output = host.run_shell_command(rdma_host.loopback_script(device, seconds))
            text = "\n".join(output.stdout_lines + output.stderr_lines)
            result = rdma_host.loopback_result(device, text)
            results.append(result)
            host.log(f"RDMA loopback {device['name']}/{device['port']}: "
                     f"{rdma_host.figures(result)}")
        return write_record(host, rdma_host.LOOPBACK_PATH,
                            {"loopback_seconds": seconds, "ports": results})

    return run


@operation(is_idempotent=False)
def loopback(seconds: int):
    devices = [d for d in (chosen_record() or {}).get("devices", [])
               if d.get("state") == "ACTIVE"]
    if not devices:
        host.noop("no ACTIVE RDMA port to measure")
        return
    yield FunctionCommand(_loopback(seconds, devices), (), {})


def measure_loopback(seconds: int) -> None:
    """perftest over each ACTIVE port to itself for ``seconds`` (host data
    ``rdma_loopback``; 0: off): figures in the log and LOOPBACK_PATH."""
    if seconds <= 0 or chosen_record() is None:
        return
    planned.action(f"ib_write_bw/ib_write_lat loopback, {seconds} s a port "
                   f"(writes {rdma_host.LOOPBACK_PATH})")
    loopback(name="RDMA loopback: ib_write_bw, ib_write_lat", seconds=seconds)
