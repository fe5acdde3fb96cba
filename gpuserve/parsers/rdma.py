"""RDMA parsers: ``ibv_devinfo``, ``rdma link``, the sysfs port and GID tables, perftest.

The host deploy records each RDMA port (device, port, state, link layer, GIDs, NUMA
node) so that the PD serve path passes only active devices to SGLang and the doctor
can name a port down, a RoCE port without a RoCE v2 GID or a NIC on another NUMA node
than the GPUs. Formats and sources: docs/disaggregation.md ("RDMA on the host").
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpuserve.parsers.common import ParseError, as_lines

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


@dataclass(frozen=True)
class Gid:
    """One GID table entry; ``type`` is "RoCE v2", "IB/RoCE v1" or None (not reported)."""

    index: int
    gid: str
    type: str | None = None


@dataclass
class RdmaPort:
    """One port of one RDMA device. ``state``: ACTIVE, DOWN, INIT, ARMED (the verbs
    names without the PORT_ prefix); ``link_layer``: InfiniBand or Ethernet (RoCE)."""

    device: str
    port: int
    state: str
    link_layer: str | None = None
    phys_state: str | None = None
    netdev: str | None = None
    numa_node: int | None = None
    gids: list[Gid] = field(default_factory=list)
    rate_gbps: float | None = None  # sysfs ports/N/rate (``100 Gb/sec (4X EDR)``)

    def as_dict(self) -> dict:
        """The host record's ``rdma.devices[]`` entry (one per port)."""
        return {"name": self.device, "port": self.port, "state": self.state,
                "link_layer": self.link_layer, "phys_state": self.phys_state,
                "netdev": self.netdev, "numa_node": self.numa_node,
                "gids": [{"index": g.index, "gid": g.gid, "type": g.type} for g in self.gids],
                "rate_gbps": self.rate_gbps}


def _state(word: str) -> str:
    """``PORT_ACTIVE (4)``, ``4: ACTIVE`` or ``ACTIVE`` -> ``ACTIVE``."""
    word = re.sub(r"\(\d+\)", "", word.split(":", 1)[-1]).strip()
    return word.removeprefix("PORT_").upper()


_HCA_RE = re.compile(r"^hca_id:\s*(\S+)")
_PORT_RE = re.compile(r"^\s+port:\s*(\d+)\s*$")
_KV_RE = re.compile(r"^\s+([A-Za-z_]+):\s*(.*?)\s*$")
_GID_RE = re.compile(r"^\s+GID\[\s*(\d+)\]:\s*([0-9a-fA-F:.]+)(?:,\s*(.+?))?\s*$")


def parse_ibv_devinfo(text: str | Iterable[str]) -> list[RdmaPort]:
    """``ibv_devinfo`` or ``ibv_devinfo -v``: one entry per port (GIDs with -v; the GID
    type when rdma-core prints one after a comma)."""
    ports: list[RdmaPort] = []
    device: str | None = None
    current: RdmaPort | None = None
    for no, line in enumerate(as_lines(text), 1):
        if match := _HCA_RE.match(line):
            device, current = match.group(1), None
        elif match := _PORT_RE.match(line):
            if device is None:
                raise ParseError("port before any hca_id", no, line)
            current = RdmaPort(device, int(match.group(1)), state="UNKNOWN")
            ports.append(current)
        elif current is not None and (match := _GID_RE.match(line)):
            current.gids.append(Gid(int(match.group(1)), match.group(2), match.group(3)))
        elif current is not None and (match := _KV_RE.match(line)):
            key, value = match.groups()
            if key == "state":
                current.state = _state(value)
            elif key == "link_layer":
                current.link_layer = value
            elif key == "phys_state":
                current.phys_state = _state(value)
    if not ports and any(line.strip() for line in as_lines(text)):
        raise ParseError("no hca_id/port in ibv_devinfo output")
    return ports


_LINK_RE = re.compile(r"^(?:\d+/\d+:\s+)?(?:link\s+)?(\S+?)/(\d+):?\s+state\s+(\S+)"
                      r"(?:\s+physical_state\s+(\S+))?(?:\s+netdev\s+(\S+))?")


def parse_rdma_link(text: str | Iterable[str]) -> list[RdmaPort]:
    """``rdma link`` / ``rdma link show`` (iproute2): both the current layout
    (``link mlx5_0/1 state ACTIVE ...``) and the older one with an index prefix."""
    ports = []
    for no, line in enumerate(as_lines(text), 1):
        if not line.strip():
            continue
        match = _LINK_RE.match(line.strip())
        if not match:
            raise ParseError("not an `rdma link` line", no, line)
        dev, port, state, phys, netdev = match.groups()
        ports.append(RdmaPort(dev, int(port), _state(state), phys_state=phys, netdev=netdev))
    return ports


_RATE_RE = re.compile(r"^\s*([\d.]+)\s*Gb/sec")


def parse_rate(text: str) -> float | None:
    """sysfs ``ports/N/rate`` (``100 Gb/sec (4X EDR)``) in Gb/s; None when unreadable."""
    match = _RATE_RE.match(text or "")
    return float(match.group(1)) if match else None


_SYSFS_RE = re.compile(r"^/sys/class/infiniband/([^/]+)/(?:ports/(\d+)/)?(.+?):(.*)$")


def parse_sysfs_rdma(text: str | Iterable[str]) -> list[RdmaPort]:
    """``grep -H . `` over /sys/class/infiniband/*: ports/N/{state,phys_state,
    link_layer,rate}, ports/N/gids/I, ports/N/gid_attrs/types/I and device/numa_node.
    Zero GIDs (unused entries) are dropped; a NUMA node of -1 (unknown) is None."""
    ports: dict[tuple[str, int], RdmaPort] = {}
    numa: dict[str, int | None] = {}
    types: dict[tuple[str, int, int], str] = {}
    for no, line in enumerate(as_lines(text), 1):
        if not line.strip():
            continue
        match = _SYSFS_RE.match(line.strip())
        if not match:
            raise ParseError("not a /sys/class/infiniband line", no, line)
        dev, port_s, attr, value = match.groups()
        value = value.strip()
        if attr == "device/numa_node":
            numa[dev] = int(value) if value.lstrip("-").isdigit() and int(value) >= 0 else None
            continue
        if port_s is None:
            continue
        port = ports.setdefault((dev, int(port_s)), RdmaPort(dev, int(port_s), "UNKNOWN"))
        if attr == "state":
            port.state = _state(value)
        elif attr == "phys_state":
            port.phys_state = value.split(":", 1)[-1].strip()
        elif attr == "link_layer":
            port.link_layer = value
        elif attr == "rate":
            port.rate_gbps = parse_rate(value)
        elif attr.startswith("gids/") and value.lower() != ZERO_GID:
            port.gids.append(Gid(int(attr.split("/")[1]), value.lower()))
        elif attr.startswith("gid_attrs/types/"):
            types[(dev, int(port_s), int(attr.rsplit("/", 1)[1]))] = value
    for (dev, num), port in ports.items():
        port.numa_node = numa.get(dev)
        port.gids = sorted((Gid(g.index, g.gid, types.get((dev, num, g.index)))
                            for g in port.gids), key=lambda g: g.index)
    return sorted(ports.values(), key=lambda p: (p.device, p.port))


@dataclass(frozen=True)
class PerftestBw:
    """perftest ``ib_*_bw``'s result row, its average in Gb/s whatever unit it printed."""

    device: str | None
    link_type: str | None
    size_bytes: int
    iterations: int
    peak: float
    average: float
    unit: str
    msg_rate_mpps: float

    @property
    def average_gbps(self) -> float:
        return self.average if self.unit == "Gb/sec" else self.average * 8 / 1000


@dataclass(frozen=True)
class PerftestLat:
    """perftest ``ib_*_lat``'s result row, in microseconds."""

    device: str | None
    size_bytes: int
    iterations: int
    t_min: float
    t_max: float
    t_typical: float
    t_avg: float
    p99: float | None


_BW_HEAD_RE = re.compile(r"BW average\[(Gb/sec|MB/sec)\]")
# a value is a number, or what perftest prints when its cycles-to-microseconds clock
# failed to calibrate (a VM's or a loaded host's clock): inf, -nan
_VALUE = r"(?:[\d.]+|-?inf|-?nan)"
_ROW_RE = re.compile(rf"^\s*(\d+)\s+(\d+)\s+({_VALUE}(?:\s+{_VALUE})+)\s*$")


def _header(lines: list[str], key: str) -> str | None:
    for line in lines:
        match = re.search(rf"\b{re.escape(key)}\s*:\s*(\S+)", line)
        if match:
            return match.group(1)
    return None


def _result_rows(lines: list[str]) -> list[tuple[int, int, list[float]]]:
    rows = []
    for line in lines:
        match = _ROW_RE.match(line)
        if match:
            rows.append((int(match.group(1)), int(match.group(2)),
                         [float(v) for v in match.group(3).split()]))
    return rows


def parse_perftest_bw(text: str | Iterable[str]) -> PerftestBw:
    """The last result row of ``ib_write_bw`` (or read/send), client or server side."""
    lines = as_lines(text)
    unit = next((m.group(1) for line in lines if (m := _BW_HEAD_RE.search(line))), None)
    rows = _result_rows(lines)
    if unit is None or not rows or len(rows[-1][2]) < 3:
        raise ParseError("no perftest bandwidth header and result row")
    size, iters, values = rows[-1]
    return PerftestBw(_header(lines, "Device"), _header(lines, "Link type"), size, iters,
                      values[0], values[1], unit, values[2])


def parse_perftest_lat(text: str | Iterable[str]) -> PerftestLat:
    """The last result row of ``ib_write_lat`` (or read/send); a value perftest printed
    as ``inf`` or ``-nan`` (its clock not calibrated) is not finite: see
    :func:`latency_fields`."""
    lines = as_lines(text)
    if not any("t_avg[usec]" in line for line in lines):
        raise ParseError("no perftest latency header (t_avg[usec])")
    rows = [r for r in _result_rows(lines) if len(r[2]) >= 4]
    if not rows:
        raise ParseError("no perftest latency result row")
    size, iters, v = rows[-1]
    return PerftestLat(_header(lines, "Device"), size, iters, v[0], v[1], v[2], v[3],
                       v[5] if len(v) > 5 else None)


#: why a latency row has no figure (:func:`latency_fields`)
UNCALIBRATED = ("perftest printed inf: its CPU clock did not calibrate (a VM's or a "
                "loaded host's), so the row has no latency; the bandwidth stands")


def latency_fields(lat: PerftestLat) -> dict:
    """A latency row as a record's fields: ``write_lat_us`` and ``write_lat_p99_us``, or,
    where perftest printed no finite average, both None and ``write_lat_note`` saying
    why (JSON has no inf)."""
    if not math.isfinite(lat.t_avg):
        return {"write_lat_us": None, "write_lat_p99_us": None, "write_lat_note": UNCALIBRATED}
    p99 = lat.p99 if lat.p99 is not None and math.isfinite(lat.p99) else None
    return {"write_lat_us": lat.t_avg, "write_lat_p99_us": p99}
