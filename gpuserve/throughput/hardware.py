"""What a box offers a decode step: memory bandwidth and FLOPs per GPU (gpus.yaml), and the
cost of one collective on its link (a class default, or the host's measured gates).

Why apart from the model: the same box serves every launch, and calibration changes only
the box (its all-reduce cost), never the architecture arithmetic.

How: docs/planner.md, "Throughput predictor".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cache
from typing import Any

from gpuserve import safeload
from gpuserve.errors import InputError
from gpuserve.paths import DATA_DIR

GB = 1e9

#: bytes of a message that move at the small-message bandwidth; the rest at the large-
#: message bus bandwidth (NCCL's LL protocol serves small messages, Simple large ones;
#: the switch lies in the tens of KiB per rank: inferred from the nccl-tests sweeps'
#: bend)
SMALL_BYTES = 64 << 10
DEFAULTS_PATH = DATA_DIR / "throughput" / "defaults.yaml"
LINKS = ("nvlink", "pcie-p2p", "pcie-no-p2p", "xgmi", "network")


@cache
def defaults() -> dict[str, Any]:
    """The predictor's data file (links, acceptance, efficiencies), checked once."""
    data = safeload.load_yaml_file(DEFAULTS_PATH)
    if not isinstance(data, dict) or not isinstance(data.get("links"), dict):
        raise InputError(DEFAULTS_PATH, "links", "the throughput defaults need a links mapping")
    for name in LINKS:
        link = data["links"].get(name)
        if not isinstance(link, dict) or not link.get("source"):
            raise InputError(DEFAULTS_PATH, f"links.{name}", "missing, or without a source")
    need = {"efficiency": ("memory", "compute", "step_overhead_us", "layer_overhead_us"),
            "speculation": ("cycle_cpu_us", "cycle_cpu_per_rank_us"), "acceptance": ("EAGLE3",)}
    for section, keys in need.items():
        for key in keys:
            if not isinstance(data.get(section), dict) or key not in data[section]:
                raise InputError(DEFAULTS_PATH, f"{section}.{key}", "missing")
    return data


@dataclass(frozen=True)
class Link:
    """One collective's cost: ``latency_us`` plus its ring bytes (``S x 2(n-1)/n``), those
    of the message's first ``SMALL_BYTES`` at the small-message bandwidth, the rest at
    the large-message bus bandwidth."""

    name: str
    latency_us: float
    small_busbw_gbs: float  # the first SMALL_BYTES of a message
    busbw_gbs: float  # large messages (prefill)
    alltoall_latency_us: float
    measured: tuple[str, ...] = ()  # which figures came from the host's gates

    def all_reduce_s(self, nbytes: float, ranks: int) -> float:
        if ranks <= 1:
            return 0.0
        return self.latency_us * 1e-6 + self._bytes_s(nbytes, 2 * (ranks - 1) / ranks)

    def _bytes_s(self, nbytes: float, ring: float) -> float:
        """The message's bytes on the wire (``ring`` x ``nbytes``): its first
        ``SMALL_BYTES`` at the small-message bandwidth."""
        small = min(nbytes, SMALL_BYTES)
        return ring * (small / (self.small_busbw_gbs * GB)
                       + (nbytes - small) / (self.busbw_gbs * GB))

    def alltoall_s(self, nbytes: float, ranks: int) -> float:
        """One dispatch or combine of ``nbytes`` per rank."""
        if ranks <= 1:
            return 0.0
        return self.alltoall_latency_us * 1e-6 + self._bytes_s(nbytes, (ranks - 1) / ranks)


def link(name: str) -> Link:
    """The class default for ``name`` (nvlink, pcie-p2p, pcie-no-p2p, network)."""
    raw = defaults()["links"].get(name)
    if raw is None:
        raise InputError("--interconnect", "interconnect",
                         f"unknown link {name!r}; known: {', '.join(LINKS)}")
    return Link(name, float(raw["all_reduce_latency_us"]), float(raw["small_busbw_gbs"]),
                float(raw["busbw_gbs"]), float(raw["alltoall_latency_us"]))


def measured_link(base: Link, *, latency_us: float | None = None,
                  busbw_gbs: float | None = None,
                  alltoall_latency_us: float | None = None) -> Link:
    """``base`` with the host's measured gates in place of the class figures: the small
    all-reduce latency and the large-message bus bandwidth (nccl-tests). A measured
    latency k times the class's scales the class's whole small-message curve by k (its
    bandwidth by 1/k): both come from the same hop through the same path, and the gates
    measure no decode-sized (KB) message."""
    changes: dict[str, Any] = {}
    if latency_us:
        changes["latency_us"] = float(latency_us)
        changes["small_busbw_gbs"] = base.small_busbw_gbs * base.latency_us / float(latency_us)
    if busbw_gbs:
        changes["busbw_gbs"] = float(busbw_gbs)
    if alltoall_latency_us:
        changes["alltoall_latency_us"] = float(alltoall_latency_us)
    return dataclasses.replace(base, measured=tuple(changes), **changes) if changes else base


def link_for(*, nvlink: bool | None, p2p: bool | None, nodes: int = 1,
             card: Gpu | None = None, gpus: int = 0) -> str:
    """The link class of a box: the GPU's own fabric (xGMI), NVLink (across nodes only
    inside an NVL72 domain), else PCIe with P2P only where it is known to work (P2P not
    measured is planned as SHM, as the gates treat it)."""
    fabric = card.fabric if card is not None else ""
    domain = card.nvlink_domain if card is not None else 0
    if nodes and nodes > 1 and not (nvlink and domain and gpus <= domain):
        return "network"
    if fabric and fabric != "nvlink":
        return fabric
    if nvlink:
        return "nvlink"
    return "pcie-p2p" if p2p else "pcie-no-p2p"


@dataclass(frozen=True)
class Gpu:
    """A GPU's decode-relevant figures (gpus.yaml)."""

    key: str
    bandwidth_gbs: float  # effective: measured read, else datasheet x efficiency
    tflops: dict[str, float]  # dense tensor TFLOPS by dtype (bf16, fp8, fp4)
    nvlink: bool
    sm_major: int
    fabric: str = ""  # a link class of its own (xgmi), else the box's NVLink/PCIe
    nvlink_domain: int = 0  # GPUs on one NVLink fabric across nodes (NVL72)


def _norm(text: str) -> str:
    return "".join(ch for ch in str(text).lower() if ch.isalnum())


@cache
def gpu(name: str) -> Gpu | None:
    """``name`` (a key, alias or nvidia-smi name) in gpus.yaml; None when unknown or
    without a memory bandwidth."""
    data = safeload.load_yaml_file(DATA_DIR / "gpus.yaml")
    want = _norm(name)
    eff = float(defaults()["efficiency"]["memory"])
    extra = {k: {**v, "aliases": v.get("names", [])} for k, v in
             (defaults().get("gpus") or {}).items()}
    for key, rec in _matches(data["gpus"], want) or _matches(extra, want):
        measured = rec.get("memory_read_measured_gbs")
        sheet = rec.get("memory_bandwidth_gbs")
        bw = float(measured) if measured else (float(sheet) * eff if sheet else 0.0)
        if not bw:
            return None
        flops = {k: float(v) for k, v in (rec.get("dense_tflops") or {}).items() if v}
        cc = str(rec.get("compute_capability", "0.0"))
        fabric = str(rec.get("link") or "")
        return Gpu(key, bw, flops, bool(rec.get("nvlink")) or fabric == "nvlink",
                   int(cc.split(".")[0] or 0), fabric,
                   int(rec.get("nvlink_domain") or 0))
    return None


def _matches(gpus: dict, want: str) -> list[tuple[str, dict]]:
    """Records named exactly ``want``, else those whose name or alias it contains (an
    nvidia-smi name such as "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"), the
    longest name first."""
    exact = [(k, r) for k, r in gpus.items()
             if want in {_norm(n) for n in (k, r.get("name", ""), *r.get("aliases", [])) if n}]
    if exact:
        return exact
    found = []
    for key, rec in gpus.items():
        names = [_norm(n) for n in (key, rec.get("name", ""), *rec.get("aliases", [])) if n]
        best = max((len(n) for n in names if len(n) >= 4 and n in want), default=0)
        if best:
            found.append((best, key, rec))
    return [(k, r) for _, k, r in sorted(found, key=lambda t: -t[0])]
