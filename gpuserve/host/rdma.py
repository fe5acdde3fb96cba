"""RDMA decisions of the host deploy: userspace packages per distribution, GPUDirect RDMA
(dma-buf or nvidia-peermem) from the driver and kernel, and the record written to
host.json (``rdma``) that the PD serve path and the doctor read.

Why, and the sources: gpuserve/data/host/rdma.yaml and docs/disaggregation.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Any

from gpuserve import safeload
from gpuserve.errors import InputError
from gpuserve.parsers.rdma import RdmaPort
from gpuserve.paths import DATA_DIR

MODES = ("auto", "on", "off")


@cache
def catalog() -> dict[str, Any]:
    return safeload.load_yaml_file(DATA_DIR / "host" / "rdma.yaml")


def rdma_mode(value: object, source: str) -> str:
    """Host data ``rdma``: auto (where the host has RDMA devices), on, off."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value not in MODES:
        raise InputError(source, "rdma", f"must be one of {', '.join(MODES)} (or true/false), "
                         f"got {value!r}")
    return str(value)


def loopback_seconds(value: object, source: str) -> int:
    """Host data ``rdma_loopback``: seconds of perftest per port, 0 (off) to 60."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 60:
        raise InputError(source, "rdma_loopback", f"must be seconds from 0 (off) to 60, "
                         f"got {value!r}")
    return value


def wanted(mode: str, ports: list[RdmaPort]) -> bool:
    """Whether this host gets the RDMA userspace: asked for, or devices found."""
    return mode == "on" or (mode == "auto" and bool(ports))


def packages(distro_id: str | None) -> tuple[str, ...]:
    """The userspace packages for the host's distribution (``ID`` of os-release)."""
    table = catalog()["packages"]
    name = (distro_id or "").lower()
    if name not in table:
        raise ValueError(f"no RDMA package list for distribution {distro_id!r} "
                         f"(known: {', '.join(sorted(table))}; gpuserve/data/host/rdma.yaml)")
    return tuple(table[name])


def _kernel_tuple(release: str | None) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", release or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


@dataclass(frozen=True)
class GpuDirect:
    """How GPU memory is registered with the NIC: "dmabuf", "nvidia-peermem" or None."""

    method: str | None
    reason: str


def gpudirect(flavour: str, branch: int, kernel_release: str | None) -> GpuDirect:
    """dma-buf where NVIDIA recommends it (open kernel module, branch and kernel new
    enough), else the legacy nvidia-peermem module, else none."""
    data = catalog()["gpudirect"]
    kernel = _kernel_tuple(kernel_release)
    need = _kernel_tuple(data["dmabuf_min_kernel"])
    if (flavour in data["dmabuf_flavours"] and branch >= data["dmabuf_min_branch"]
            and kernel is not None and need is not None and kernel >= need):
        return GpuDirect("dmabuf", f"open kernel module {branch}, kernel {kernel_release} "
                         f">= {data['dmabuf_min_kernel']}: dma-buf (NVIDIA's recommended "
                         "path, no extra module)")
    if branch >= data["peermem_min_branch"]:
        why = (f"{flavour} kernel module" if flavour not in data["dmabuf_flavours"] else
               f"kernel {kernel_release or 'unknown'} < {data['dmabuf_min_kernel']}"
               if kernel is None or need is None or kernel < need else
               f"branch {branch} < {data['dmabuf_min_branch']}")
        return GpuDirect("nvidia-peermem", f"{why}: the legacy {data['peermem_module']} "
                         "module, loaded at boot")
    return GpuDirect(None, f"driver branch {branch} has neither dma-buf nor nvidia-peermem")


def record(ports: list[RdmaPort], gpu_numa: list[int | None],
           direct: GpuDirect | None) -> dict[str, Any]:
    """host.json's ``rdma``: every port (devices[]), the GPUs' NUMA nodes and the
    GPUDirect choice. The PD serve path passes only ACTIVE devices to SGLang."""
    return {"devices": [p.as_dict() for p in ports],
            "gpu_numa_nodes": sorted({n for n in gpu_numa if n is not None}),
            "gpudirect": None if direct is None else {"method": direct.method,
                                                       "reason": direct.reason}}


def has_roce_v2(device: dict) -> bool:
    return any(g.get("type") == "RoCE v2" for g in device.get("gids") or [])


def problems(rdma: dict) -> list[tuple[str, str]]:
    """(kind, evidence) of each RDMA fault in a host.json ``rdma`` record: port_down,
    no_roce_v2_gid, numa_mismatch. The doctor's rules name and explain them."""
    found = []
    gpu_nodes = set(rdma.get("gpu_numa_nodes") or [])
    for dev in rdma.get("devices") or []:
        name = f"{dev.get('name')}/{dev.get('port')}"
        if dev.get("state") != "ACTIVE":
            found.append(("port_down", f"{name} is {dev.get('state')} "
                          f"(physical {dev.get('phys_state')})"))
            continue
        if dev.get("link_layer") == "Ethernet" and not has_roce_v2(dev):
            found.append(("no_roce_v2_gid", f"{name} is RoCE (Ethernet) with no RoCE v2 GID "
                          f"({len(dev.get('gids') or [])} GIDs)"))
        node = dev.get("numa_node")
        if gpu_nodes and node is not None and node not in gpu_nodes:
            found.append(("numa_mismatch", f"{name} is on NUMA node {node}, the GPUs on "
                          f"{sorted(gpu_nodes)}"))
    return found


LOOPBACK_PATH = "/etc/gpuserve/rdma-loopback.json"


def roce_v2_index(device: dict) -> int | None:
    """A RoCE v2 GID index of a recorded port for perftest's ``-x``: an IPv4-mapped one
    first (routable, what NCCL picks by default), else the first v2; None without."""
    v2 = [g for g in device.get("gids") or [] if g.get("type") == "RoCE v2"]
    mapped = [g for g in v2 if "0000:ffff:" in str(g.get("gid", "")).lower()]
    return (mapped or v2)[0]["index"] if v2 else None


def loopback_script(device: dict, seconds: int, tcp_port: int = 18515) -> str:
    """Shell: perftest's ib_write_bw then ib_write_lat, server and client on this host
    over ``device`` (its traffic goes through the device and back: a verbs smoke test
    of device, driver and userspace, not a figure between hosts). Each client's output
    follows a section marker; ``timeout`` bounds every process."""
    from gpuserve.parsers.sections import marker

    name, port = device["name"], int(device["port"])
    gid = roce_v2_index(device) if device.get("link_layer") == "Ethernet" else None
    common = f"-d {name} -i {port}" + (f" -x {gid}" if gid is not None else "") + " -F"
    limit = seconds + 30
    steps = []
    for tool, extra, section in (("ib_write_bw", f"-D {seconds} --report_gbits", "bw"),
                                 ("ib_write_lat", "-n 1000", "lat")):
        steps.append(
            f"timeout {limit} {tool} {common} {extra} -p {tcp_port} >/dev/null 2>&1 & _s=$!; "
            f"sleep 1; echo '{marker(section)}'; "
            f"timeout {limit} {tool} {common} {extra} -p {tcp_port} 127.0.0.1 2>&1; "
            "wait $_s")
    return "; ".join(steps)


def loopback_result(device: dict, output: str) -> dict[str, Any]:
    """The figures of :func:`loopback_script`'s output, or the tool's own error text."""
    from gpuserve.parsers.rdma import latency_fields, parse_perftest_bw, parse_perftest_lat
    from gpuserve.parsers.sections import split_sections

    sections = split_sections(output)
    result: dict[str, Any] = {"name": device["name"], "port": device["port"]}
    try:
        bw = parse_perftest_bw(sections.get("bw", []))
        lat = parse_perftest_lat(sections.get("lat", []))
    except ValueError as exc:
        tail = [line for line in output.splitlines() if line.strip()][-3:]
        result["error"] = f"{exc}: {' | '.join(tail)}"
        return result
    result.update(write_bw_gbps=round(bw.average_gbps, 3), write_bw_size=bw.size_bytes,
                  **latency_fields(lat))
    return result


def figures(result: dict) -> str:
    """One measurement's figures for the deploy's log (its error when the tools failed)."""
    if "error" in result:
        return f"error: {result['error']}"
    if result.get("write_lat_us") is None:
        return f"write {result['write_bw_gbps']} Gb/s, latency: {result.get('write_lat_note')}"
    return (f"write {result['write_bw_gbps']} Gb/s, latency {result['write_lat_us']} us "
            f"(p99 {result['write_lat_p99_us']})")
