"""Parsers for ``nvidia-smi`` output: ``--query-gpu`` CSV, the plain table, ``topo -m``
and ``topo -p2p``.

Formats follow what nvidia-smi prints (``nvidia-smi --help-query-gpu`` and
``nvidia-smi topo -h``); samples with their sources are in tests/fixtures/gpuhost/ and
tests/fixtures/nvidia_smi/ (SOURCES.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, TypedDict

from gpuserve.parsers.common import ParseError, as_lines, na_to_none, strip_sgr

# The query the facts run; the order is the column order of a header-less CSV.
QUERY_FIELDS: tuple[str, ...] = (
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "memory.total",
    "memory.used",
    "driver_version",
    "compute_cap",
    "persistence_mode",
)
QUERY_COMMAND = (
    "nvidia-smi --query-gpu=" + ",".join(QUERY_FIELDS) + " --format=csv,noheader,nounits"
)


class GpuInfo(TypedDict):
    """One GPU as the host-facts document carries it (docs/architecture.md)."""

    index: int
    name: str | None
    uuid: str | None
    bus_id: str | None
    memory_total_mib: int | None
    # Used before SGLang starts: unequal figures across GPUs abort SGLang's startup
    # ("The memory capacity is unbalanced", distributed/bootstrap.py).
    memory_used_mib: int | None
    driver_version: str | None
    compute_cap: str | None
    persistence_mode: str | None


# Header cells are query field names, with units in brackets unless nounits is given
# ("memory.total [MiB]"); values never look like that.
_HEADER_CELL_RE = re.compile(r"^([a-z][a-z0-9_.]*)(?:\s*\[[^\]]*\])?$")
_MIB_RE = re.compile(r"^(\d+)(?:\s*MiB)?$")


def mib(value: str | None) -> int | None:
    """"97887 MiB" or "97887" -> 97887; None for None / "[N/A]"; ValueError otherwise."""
    value = na_to_none(value) if value is not None else None
    if value is None:
        return None
    match = _MIB_RE.match(value)
    if not match:
        raise ValueError(f"not a MiB count: {value!r}")
    return int(match.group(1))


def _query_rows(
    lines: list[str], fields: Iterable[str]
) -> list[tuple[int, str, int, dict[str, str | None]]]:
    """(line number, line, sample number, row) for every data row of a query output.

    A header line seen again after rows starts a new sample: ``--format=csv`` with ``-l N``
    (or two runs pasted together) prints the header before every sample.
    """
    rows: list[tuple[int, str, int, dict[str, str | None]]] = []
    columns = list(fields)
    header: list[str] | None = None
    sample = 1
    for line_no, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line:
            continue
        cells = [cell.strip() for cell in line.split(",")]
        names = [_HEADER_CELL_RE.match(cell) for cell in cells]
        if all(names):
            found = [m.group(1) for m in names if m]
            if not rows and header is None:
                columns = header = found
                continue
            if found == header:
                sample += 1
                continue
        if len(cells) != len(columns):
            raise ParseError(
                f"expected {len(columns)} comma-separated values, got {len(cells)}", line_no, raw
            )
        row = {c: na_to_none(v) for c, v in zip(columns, cells, strict=True)}
        rows.append((line_no, raw, sample, row))
    return rows


def parse_query_csv(
    text: str | Iterable[str], fields: Iterable[str] = QUERY_FIELDS
) -> list[dict[str, str | None]]:
    """Parse any ``nvidia-smi --query-*=... --format=csv[,noheader][,nounits]`` output.

    Values are joined by ``", "`` (one line per GPU). ``fields`` names the columns when
    there is no header line; a header line (``name, memory.total [MiB]``) overrides it,
    and the same header repeated later (a looped ``-l`` sample) is skipped.
    ``[N/A]`` / ``[Not Supported]`` become None; units are left on the values.
    """
    return [row for _, _, _, row in _query_rows(as_lines(text), fields)]


def _gpu_key(gpu: GpuInfo, has_index: bool) -> str | None:
    """What identifies one GPU across samples: uuid, else bus id, else a printed index."""
    if gpu["uuid"] is not None:
        return f"uuid:{gpu['uuid']}"
    if gpu["bus_id"] is not None:
        return f"bus:{gpu['bus_id'].upper()}"
    return f"index:{gpu['index']}" if has_index else None


def _dedupe_samples(
    gpus: list[tuple[int, str, int, GpuInfo]], has_index: bool
) -> list[GpuInfo]:
    """One record per GPU, the last sample's figures, in first-seen order.

    A looped query (``-l 1``) repeats every GPU once per sample; counting the repeats
    would tell the planner and the doctor that one H200 is eight. Rows without any
    identity column cannot be told apart: a repeated header then means a looped paste,
    which is refused rather than guessed at.
    """
    samples = {sample for _, _, sample, _ in gpus}
    keyed: dict[str, GpuInfo] = {}
    index_owner: dict[int, str] = {}
    for line_no, raw, _, gpu in gpus:
        key = _gpu_key(gpu, has_index)
        if key is None:
            if len(samples) > 1:
                raise ParseError(
                    "the header repeats: this is a looped (-l) or repeated paste, and "
                    "without index, uuid or pci.bus_id columns its GPUs cannot be told "
                    "apart; paste one sample",
                    line_no,
                    raw,
                )
            return [g for _, _, _, g in gpus]
        owner = index_owner.setdefault(gpu["index"], key)
        if owner != key and has_index:
            raise ParseError(
                f"two different GPUs report index {gpu['index']} ({owner} and {key}): "
                "outputs of two hosts pasted together?",
                line_no,
                raw,
            )
        keyed[key] = gpu
    return list(keyed.values())


def parse_query_gpu(
    text: str | Iterable[str], fields: Iterable[str] = QUERY_FIELDS
) -> list[GpuInfo]:
    """Parse the GPU query into the document's GPU records, one per GPU.

    Columns outside QUERY_FIELDS are ignored; missing ones are None (``index`` defaults
    to the line's position). A looped output (``-l N``: the same GPUs again and again)
    gives each GPU once, with its last sample (see _dedupe_samples). Raises ParseError
    naming the line for a bad index, memory figure or uuid.
    """
    parsed: list[tuple[int, str, int, GpuInfo]] = []
    has_index = False
    for line_no, raw, sample, row in _query_rows(as_lines(text), fields):
        gpu: GpuInfo = {
            "index": len(parsed),
            "name": row.get("name"),
            "uuid": row.get("uuid"),
            "bus_id": row.get("pci.bus_id"),
            "memory_total_mib": None,
            "memory_used_mib": None,
            "driver_version": row.get("driver_version"),
            "compute_cap": row.get("compute_cap"),
            "persistence_mode": row.get("persistence_mode"),
        }
        index = row.get("index")
        if index is not None:
            if not index.isdigit():
                raise ParseError(f"index is not a number ({index!r})", line_no, raw)
            gpu["index"] = int(index)
            has_index = True
        for column, key in (
            ("memory.total", "memory_total_mib"),
            ("memory.used", "memory_used_mib"),
        ):
            try:
                gpu[key] = mib(row.get(column))  # type: ignore[literal-required]
            except ValueError as exc:
                raise ParseError(f"{column}: {exc}", line_no, raw) from None
        if gpu["uuid"] is not None and not gpu["uuid"].startswith(("GPU-", "MIG-")):
            raise ParseError(f"uuid does not start with GPU- ({gpu['uuid']!r})", line_no, raw)
        if gpu["compute_cap"] is not None and not re.fullmatch(r"\d+\.\d+", gpu["compute_cap"]):
            raise ParseError(f"compute_cap is not N.M ({gpu['compute_cap']!r})", line_no, raw)
        parsed.append((line_no, raw, sample, gpu))
    return _dedupe_samples(parsed, has_index)


# ------------------------------------------------------------------ plain table

# The banner: "NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: 13.0"; R610
# renames the two fields "KMD Version" and "CUDA UMD Version".
_BANNER_RE = re.compile(
    r"NVIDIA-SMI\s+(?P<smi>\S+)\s+(?:Driver|KMD) Version:\s+(?P<driver>\S+)"
    r"(?:\s+CUDA (?:UMD )?Version:\s+(?P<cuda>\S+))?"
)
# First cell of a GPU's first row: index, name (cut to fit the column, ending in "...")
# and Persistence-M (Linux) or the driver model (Windows: WDDM / TCC).
_TABLE_GPU_RE = re.compile(
    r"^\s*(?P<index>\d+)\s+(?P<name>\S.*?)\s+(?P<pm>On|Off|WDDM|TCC|N/A)\s*$"
)
_TABLE_BUS_RE = re.compile(
    r"^\s*(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s+\S+\s*$"
)
_TABLE_MEM_RE = re.compile(r"^\s*(?P<used>\d+)MiB\s*/\s*(?P<total>\d+)MiB\s*$")
_PERSISTENCE = {"On": "Enabled", "Off": "Disabled"}


@dataclass
class SmiTable:
    """The boxed table plain ``nvidia-smi`` prints (what users paste first).

    ``gpus`` carry the fields the query parser gives where the table has them: index,
    name (as printed: long names are cut and end in "..."), bus_id, persistence_mode
    (Enabled/Disabled as the query spells it; None under Windows' WDDM/TCC), memory
    used/total MiB and the banner's driver version. uuid and compute_cap are not in the
    table (None).
    """

    gpus: list[GpuInfo]
    driver_version: str | None
    cuda_version: str | None
    smi_version: str | None = None


def parse_smi_table(text: str | Iterable[str]) -> SmiTable:
    """Parse plain ``nvidia-smi`` output (both layouts: R530+ and the older narrower one).

    A looped paste (``nvidia-smi -l 1``) repeats the whole table: each GPU is kept once,
    with its last sample. The Processes and MIG sections are skipped. A paste cut short
    keeps the GPUs it shows (a GPU whose memory row is missing has None figures).
    Raises ParseError when there is no banner or no GPU row.
    """
    banner: re.Match[str] | None = None
    by_bus: dict[str, GpuInfo] = {}
    current: GpuInfo | None = None
    in_gpus = False
    for raw in as_lines(text):
        match = _BANNER_RE.search(raw)
        if match:
            banner, in_gpus, current = match, True, None
            continue
        if "Processes:" in raw or "MIG devices:" in raw:
            in_gpus, current = False, None
            continue
        if not in_gpus or raw.count("|") < 3:
            continue
        cells = raw.strip().strip("|").split("|")
        gpu_row = _TABLE_GPU_RE.match(cells[0])
        bus_row = _TABLE_BUS_RE.match(cells[1]) if len(cells) > 1 else None
        if gpu_row and bus_row:
            bus_id = bus_row.group("bus").upper()
            current = {
                "index": int(gpu_row.group("index")),
                "name": gpu_row.group("name"),
                "uuid": None,
                "bus_id": bus_id,
                "memory_total_mib": None,
                "memory_used_mib": None,
                "driver_version": na_to_none(banner.group("driver")) if banner else None,
                "compute_cap": None,
                "persistence_mode": _PERSISTENCE.get(gpu_row.group("pm")),
            }
            by_bus.pop(bus_id, None)
            by_bus[bus_id] = current
            continue
        memory = _TABLE_MEM_RE.match(cells[1]) if len(cells) > 1 else None
        if memory and current is not None and current["memory_total_mib"] is None:
            current["memory_used_mib"] = int(memory.group("used"))
            current["memory_total_mib"] = int(memory.group("total"))
    if banner is None:
        raise ParseError("no 'NVIDIA-SMI ... Driver Version: ...' banner: not nvidia-smi output")
    if not by_bus:
        raise ParseError("no GPU rows ('|   0  <name>  On | <bus id> ...') in the table")
    gpus = sorted(by_bus.values(), key=lambda g: g["index"])
    cuda = banner.group("cuda")
    return SmiTable(
        gpus=gpus,
        driver_version=na_to_none(banner.group("driver")),
        cuda_version=na_to_none(cuda) if cuda else None,
        smi_version=banner.group("smi"),
    )


# --------------------------------------------------------------------------- topo -m

# Link cells in the ``topo -m`` matrix (legend of current drivers; SOC is the pre-2018
# name of SYS, NV# a bonded set of # NVLinks, NVB "traversing multiple NVLinks").
_LINK_RE = re.compile(r"^(X|SYS|SOC|NODE|PHB|PXB|PIX|NVB|NV\d+)$")
_AFFINITY_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_HEADER_TOKEN_RE = re.compile(r"CPU Affinity|NUMA Affinity|GPU NUMA ID|\S+")
_NIC_LEGEND_RE = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")


@dataclass
class Topology:
    """``nvidia-smi topo -m``: links between devices and each GPU's CPU/NUMA affinity.

    ``links`` is the GPU x GPU matrix (``"X"`` on the diagonal); ``nic_links`` maps each
    NIC column name to its link towards every GPU; ``nics`` is the NIC legend
    (``NIC0 -> mlx5_0``). Affinity lists are per GPU, None where nvidia-smi prints
    ``N/A`` or the column is absent (older drivers have no NUMA columns).
    """

    gpus: list[str]
    links: list[list[str]]
    nic_links: dict[str, list[str]] = field(default_factory=dict)
    nics: dict[str, str] = field(default_factory=dict)
    cpu_affinity: list[str | None] = field(default_factory=list)
    numa_affinity: list[str | None] = field(default_factory=list)
    gpu_numa_id: list[str | None] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "gpus": self.gpus,
            "links": self.links,
            "nic_links": self.nic_links,
            "nics": self.nics,
            "cpu_affinity": self.cpu_affinity,
            "numa_affinity": self.numa_affinity,
            "gpu_numa_id": self.gpu_numa_id,
        }


def parse_topo_matrix(text: str | Iterable[str]) -> Topology:
    """Parse ``nvidia-smi topo -m`` (cells separated by tabs or runs of spaces; the
    header's underline escapes dropped)."""
    lines = [strip_sgr(line) for line in as_lines(text)]
    header: list[str] | None = None
    rows: dict[str, list[str]] = {}
    affinities: dict[str, list[str]] = {}
    nics: dict[str, str] = {}
    in_legend = False
    in_nic_legend = False
    for line_no, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("Legend"):
            in_legend, in_nic_legend = True, False
            continue
        if line.startswith("NIC Legend"):
            in_legend, in_nic_legend = False, True
            continue
        if in_nic_legend:
            match = _NIC_LEGEND_RE.match(raw)
            if not match:
                raise ParseError("bad NIC legend entry", line_no, raw)
            nics[match.group(1)] = match.group(2)
            continue
        if in_legend:
            continue
        if header is None:
            tokens = _HEADER_TOKEN_RE.findall(raw)
            devices = [t for t in tokens if t not in _AFFINITY_COLUMNS]
            if not devices or not devices[0].startswith("GPU"):
                raise ParseError("expected the topo -m header (GPU0 GPU1 ...)", line_no, raw)
            header = tokens
            continue
        devices = [t for t in header if t not in _AFFINITY_COLUMNS]
        tokens = line.split()
        label = tokens[0]
        if label not in devices:
            raise ParseError(f"row label {label!r} is not a header column", line_no, raw)
        cells = tokens[1 : 1 + len(devices)]
        if len(cells) != len(devices):
            raise ParseError(f"expected {len(devices)} link cells", line_no, raw)
        for cell in cells:
            if not _LINK_RE.match(cell):
                raise ParseError(f"unknown link type {cell!r}", line_no, raw)
        rows[label] = cells
        affinities[label] = tokens[1 + len(devices) :]
    if header is None:
        raise ParseError("no topo -m header found")
    devices = [t for t in header if t not in _AFFINITY_COLUMNS]
    affinity_columns = [t for t in header if t in _AFFINITY_COLUMNS]
    gpus = [d for d in devices if d.startswith("GPU")]
    missing = [g for g in gpus if g not in rows]
    if missing:
        raise ParseError(f"no matrix row for {', '.join(missing)}")
    gpu_cols = [devices.index(g) for g in gpus]
    topo = Topology(gpus=gpus, links=[[rows[g][c] for c in gpu_cols] for g in gpus], nics=nics)
    for device in devices:
        if device not in gpus and device in rows:
            topo.nic_links[device] = [rows[device][c] for c in gpu_cols]
    per_column: dict[str, list[str | None]] = {name: [] for name in _AFFINITY_COLUMNS}
    for gpu in gpus:
        values = affinities[gpu]
        for i, name in enumerate(affinity_columns):
            per_column[name].append(na_to_none(values[i]) if i < len(values) else None)
    n = len(gpus)
    topo.cpu_affinity = per_column["CPU Affinity"] or [None] * n
    topo.numa_affinity = per_column["NUMA Affinity"] or [None] * n
    topo.gpu_numa_id = per_column["GPU NUMA ID"] or [None] * n
    return topo


# ----------------------------------------------------------------------- topo -p2p

# ``nvidia-smi topo -p2p`` legend: OK, CNS chipset / GNS GPU / TNS topology not
# supported, NS not supported, DR disabled by regkey, U unknown.
P2P_STATUSES = frozenset({"X", "OK", "CNS", "GNS", "TNS", "NS", "DR", "U"})
P2PVerdict = Literal["ok", "none", "partial"]


@dataclass
class P2PMatrix:
    """``nvidia-smi topo -p2p <mode>``: status of every ordered GPU pair."""

    gpus: list[str]
    cells: list[list[str]]

    def to_json(self) -> dict:
        return {"gpus": self.gpus, "cells": self.cells}


def parse_p2p_matrix(text: str | Iterable[str]) -> P2PMatrix:
    """Parse the matrix printed by ``nvidia-smi topo -p2p r|w|n|a|p`` (legend ignored,
    the header's underline escapes dropped)."""
    gpus: list[str] | None = None
    rows: dict[str, list[str]] = {}
    for line_no, raw in enumerate((strip_sgr(line) for line in as_lines(text)), start=1):
        tokens = raw.split()
        if not tokens:
            continue
        if tokens[0].startswith("Legend"):
            break
        if gpus is None:
            if not all(re.fullmatch(r"GPU\d+", t) for t in tokens):
                raise ParseError("expected the -p2p header (GPU0 GPU1 ...)", line_no, raw)
            gpus = tokens
            continue
        label, cells = tokens[0], tokens[1:]
        if label not in gpus or len(cells) != len(gpus):
            raise ParseError(f"expected '<GPUn>' and {len(gpus)} status cells", line_no, raw)
        bad = [c for c in cells if c not in P2P_STATUSES]
        if bad:
            raise ParseError(f"unknown P2P status {bad[0]!r}", line_no, raw)
        rows[label] = cells
    if gpus is None:
        raise ParseError("no -p2p header found")
    missing = [g for g in gpus if g not in rows]
    if missing:
        raise ParseError(f"no matrix row for {', '.join(missing)}")
    return P2PMatrix(gpus=gpus, cells=[rows[g] for g in gpus])


def p2p_verdict(*matrices: P2PMatrix | None) -> P2PVerdict | None:
    """Judge P2P over all GPU pairs: "ok" if every pair is OK in every given matrix,
    "none" if no pair is, "partial" otherwise; None with no matrix or fewer than 2 GPUs.

    A pair counts as OK only when all the matrices (e.g. read and write) say OK, since
    NCCL and SGLang's custom all-reduce need both directions.
    """
    present = [m for m in matrices if m is not None]
    if not present:
        return None
    n = len(present[0].gpus)
    if n < 2 or any(len(m.gpus) != n for m in present):
        return None
    pair_ok = [
        all(m.cells[i][j] == "OK" for m in present)
        for i in range(n)
        for j in range(n)
        if i != j
    ]
    if all(pair_ok):
        return "ok"
    if not any(pair_ok):
        return "none"
    return "partial"


# -- nvidia-smi -q: the Fabric section ------------------------------------------------

_Q_GPU_RE = re.compile(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_Q_FIELD_RE = re.compile(r"^(\s*)([^:]+?)\s*:\s*(.*?)\s*$")
#: Fabric fields as ``nvidia-smi -q`` names them -> FabricInfo keys
_FABRIC_FIELDS = {"State": "state", "Status": "status", "CliqueId": "clique_id",
                  "ClusterUUID": "cluster_uuid", "Summary": "health_summary"}


class FabricInfo(TypedDict):
    """One GPU's ``Fabric`` block of ``nvidia-smi -q`` (values verbatim; "N/A" kept)."""

    bus_id: str | None
    state: str | None
    status: str | None
    clique_id: str | None
    cluster_uuid: str | None
    health_summary: str | None


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def parse_fabric(text: str | Iterable[str]) -> list[FabricInfo]:
    """Every ``Fabric`` block of ``nvidia-smi -q`` output, in order, each with the bus id
    of the ``GPU 00000000:19:00.0`` header above it (None for a block cut out of its
    document, e.g. a ``grep -A`` excerpt).

    The block is the lines indented deeper than its ``Fabric`` line; ``Health`` is a
    sub-block whose ``Summary`` is kept (the NVML fields behind it: ``nvmlGpuFabricInfo``;
    hosts.md §1.5). Lines that are not ``Key : Value`` are skipped."""
    lines = text.splitlines() if isinstance(text, str) else list(text)
    out: list[FabricInfo] = []
    bus: str | None = None
    block: FabricInfo | None = None
    depth = 0
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        gpu = _Q_GPU_RE.match(line)
        if gpu:
            bus, block = gpu.group(1), None
            continue
        if block is not None and _indent(line) <= depth:
            block = None
        if block is None:
            if line.strip() == "Fabric":
                block = FabricInfo(bus_id=bus, state=None, status=None, clique_id=None,
                                   cluster_uuid=None, health_summary=None)
                depth = _indent(line)
                out.append(block)
            continue
        pair = _fabric_field(line)
        if pair is not None:
            key, value = pair
            block[key] = value  # type: ignore[literal-required]
    return out


def _fabric_field(line: str) -> tuple[str, str] | None:
    match = _Q_FIELD_RE.match(line)
    if not match or match.group(2) not in _FABRIC_FIELDS:
        return None
    return _FABRIC_FIELDS[match.group(2)], match.group(3)


#: ``--query-gpu`` fields of the fabric registration (NVML nvmlGpuFabricInfo; the same
#: values as ``-q``'s Fabric block: NVIDIA/gpu-driver-container#909, NVIDIA/NVSentinel#889)
FABRIC_QUERY_FIELDS = ("pci.bus_id", "fabric.state", "fabric.status")
FABRIC_QUERY_COMMAND = (
    f"nvidia-smi --query-gpu={','.join(FABRIC_QUERY_FIELDS)} --format=csv,noheader")


def parse_fabric_query(text: str | Iterable[str]) -> list[FabricInfo]:
    """:data:`FABRIC_QUERY_COMMAND` output as :class:`FabricInfo` records ("N/A" kept as
    "N/A", as ``-q`` prints it)."""
    out: list[FabricInfo] = []
    for row in parse_query_csv(text, FABRIC_QUERY_FIELDS):
        out.append(FabricInfo(bus_id=row.get("pci.bus_id"),
                              state=row.get("fabric.state") or "N/A",
                              status=row.get("fabric.status") or "N/A", clique_id=None,
                              cluster_uuid=None, health_summary=None))
    return out
