"""pyinfra fact: the host's RDMA ports, GID tables, NUMA nodes and GPUDirect state.

One remote command, bounded (``head``): sysfs through one ``grep -H`` (no per-file
process, a host with 8 NICs has thousands of GID entries), the NVIDIA GPUs' NUMA nodes,
``rdma link`` for the net devices when iproute2 has it, whether nvidia_peermem is loaded
and the kernel release. Parsed by gpuserve.parsers.rdma.
"""

from __future__ import annotations

from typing import Any

from gpuserve.facts.base import ParsedFact
from gpuserve.parsers import rdma
from gpuserve.parsers.sections import marker, split_sections

IB = "/sys/class/infiniband"
MAX_LINES = 20000  # 8 NICs x 2 ports x 256 GIDs x 2 (value, type) is 8192

RDMA_COMMAND = (
    f"echo '{marker('ib')}'; "
    f"grep -H . {IB}/*/device/numa_node {IB}/*/ports/*/state {IB}/*/ports/*/phys_state "
    f"{IB}/*/ports/*/link_layer {IB}/*/ports/*/rate {IB}/*/ports/*/gids/* "
    f"{IB}/*/ports/*/gid_attrs/types/* "
    f"2>/dev/null | head -n {MAX_LINES}; "
    f"echo '{marker('gpu_numa')}'; "
    "grep -H . /sys/bus/pci/drivers/nvidia/*/numa_node 2>/dev/null | head -n 64; "
    f"echo '{marker('link')}'; "
    "command -v rdma >/dev/null 2>&1 && rdma link show 2>/dev/null | head -n 256; "
    f"echo '{marker('peermem')}'; "
    "[ -d /sys/module/nvidia_peermem ] && echo loaded; "
    f"echo '{marker('kernel')}'; uname -r; true"
)


def parse_rdma_fact(output: list[str]) -> dict[str, Any]:
    """``{"ports": [RdmaPort], "gpu_numa": [int|None], "peermem_loaded": bool,
    "kernel": str|None}``; netdevs from ``rdma link`` joined onto the sysfs ports."""
    sections = split_sections(output)
    if "ib" not in sections or "kernel" not in sections:
        raise ValueError("RDMA fact output without its sections")
    ports = rdma.parse_sysfs_rdma(sections["ib"])
    try:
        links = {(p.device, p.port): p.netdev for p in rdma.parse_rdma_link(
            sections.get("link", []))}
    except ValueError:  # an iproute2 too old for `rdma`: netdevs stay unknown
        links = {}
    for port in ports:
        port.netdev = links.get((port.device, port.port))
    gpu_numa = []
    for line in sections.get("gpu_numa", []):
        value = line.rsplit(":", 1)[-1].strip()
        gpu_numa.append(int(value) if value.isdigit() else None)
    kernel = next((line.strip() for line in sections["kernel"] if line.strip()), None)
    return {"ports": ports, "gpu_numa": gpu_numa, "kernel": kernel,
            "peermem_loaded": any(line.strip() == "loaded" for line in
                                  sections.get("peermem", []))}


class RdmaDevices(ParsedFact[dict[str, Any] | None]):
    """The host's RDMA ports (sysfs), GPU NUMA nodes, peermem state, kernel release."""

    def command(self) -> str:
        return RDMA_COMMAND

    def parse(self, output: list[str]) -> dict[str, Any] | None:
        return parse_rdma_fact(output)
