"""Measured GPU gates: pinned tool sources, expectations, decisions.

Why: the driver's P2P report (``nvidia-smi topo -p2p``) and what the box does differ (a
VM without P2P, RTX PRO 6000 hosts whose P2P transport hangs, custom all-reduce over
PCIe at 38 tok/s). A host is ready only when its collectives and GPU-to-GPU paths have
been *measured* and are what the profile assumes. This module is the pure part: it
reads the data files (``gpuserve/data/gates/``), classifies a host's topology, reads the
figures that matter out of parsed nccl-tests / p2pBandwidthLatencyTest output, chooses
the NCCL env from measurement, judges figures against expectations or a host's own
baseline, and defines the ``gpuserve.measure/1`` record. Building and running the
tools on hosts is not here (see docs/architecture.md, "Measured GPU gates").
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from gpuserve import safeload
from gpuserve.errors import InputError
from gpuserve.host.hostfacts import HostFacts
from gpuserve.measure.record_files import safe_name, write_new_file
from gpuserve.parsers.nccl_tests import NcclTestsResult
from gpuserve.parsers.p2p_bandwidth import P2PBandwidthReport, off_diagonal
from gpuserve.paths import DATA_DIR

GATES_DIR = DATA_DIR / "gates"
SOURCES_PATH = GATES_DIR / "sources.yaml"
EXPECTATIONS_PATH = GATES_DIR / "expectations.yaml"
SOURCES_SCHEMA = "gpuserve.gate-sources/1"
EXPECTATIONS_SCHEMA = "gpuserve.gate-expectations/1"
MEASURE_SCHEMA = "gpuserve.measure/1"

#: metric -> (unit, which direction is better). The data file may use only these.
METRICS: dict[str, tuple[str, str]] = {
    "all_reduce_busbw": ("GB/s", "higher"),
    "all_reduce_latency": ("us", "lower"),
    # recorded on EP hosts (gate_runs.gate_collectives); judged only where a class names them
    "all_gather_busbw": ("GB/s", "higher"),
    "all_gather_latency": ("us", "lower"),
    "alltoall_busbw": ("GB/s", "higher"),
    "alltoall_latency": ("us", "lower"),
    "p2p_unidir_best": ("GB/s", "higher"),
    "p2p_unidir_worst": ("GB/s", "higher"),
    "p2p_bidir_best": ("GB/s", "higher"),
    "p2p_latency_worst": ("us", "lower"),
}
#: The classes :func:`topology_class` can return; expectations.yaml must cover exactly these.
TOPOLOGY_CLASSES = ("nvlink4", "nvlink-other", "pcie5-x16-p2p", "pcie-p2p", "pcie-no-p2p")
# GPUs whose NVLink is generation 4 at the full 900 GB/s the nvlink4 figures were
# published on (H100/H200 SXM). H800 (NVLink cut to 400 GB/s) and others fall to
# nvlink-other, which gates against the host's own baseline.
_NVLINK4_NAMES = re.compile(r"\b(?:H100|H200)\b", re.IGNORECASE)
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_URL = re.compile(r"^(?:https://|http://|file://|git@|/)\S+$")

# ----------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class ToolSource:
    """One pinned measuring tool: where to get it and how to prove it is the pinned one."""

    name: str
    url: str
    source: str
    commit: str | None = None
    tag: str | None = None
    sha256: str | None = None  # of a release archive at ``url``
    version: str | None = None
    binaries: tuple[str, ...] = ()
    build: dict[str, Any] = field(default_factory=dict)

    def check_commit(self, head: str, where: str = "checkout") -> None:
        """Refuse a checkout whose ``git rev-parse HEAD`` is not the pinned commit."""
        if self.commit is None:
            raise InputError(where, f"tools.{self.name}", "has no pinned commit to verify")
        if head.strip().lower() != self.commit:
            raise InputError(where, f"tools.{self.name}.commit",
                             f"checkout is at {head.strip()!r}, pinned {self.commit}")

    def check_archive(self, data: bytes, where: str = "archive") -> None:
        """Refuse an archive whose sha256 is not the pinned one (before anything unpacks)."""
        if self.sha256 is None:
            raise InputError(where, f"tools.{self.name}", "has no pinned sha256 to verify")
        digest = hashlib.sha256(data).hexdigest()
        if digest != self.sha256:
            raise InputError(where, f"tools.{self.name}.sha256",
                             f"archive sha256 is {digest}, pinned {self.sha256}")


def load_sources(
    path: str | Path = SOURCES_PATH, overrides: Mapping[str, Any] | None = None,
    overrides_source: str = "host data",
) -> dict[str, ToolSource]:
    """Read and check ``sources.yaml``; ``overrides`` (host data) may replace a tool's URL.

    A mirror changes only where the bytes come from: the pin (commit or sha256) stays, so
    a mirror serving other content fails the check after checkout or download. An
    override may also bring its own archive ``sha256`` (a site's vetted archive of the
    tool, e.g. a mirror that serves tarballs, not git): that replaces the pin with another
    pin, never with none. ``overrides_source`` names the inventory in errors.
    """
    file = str(path)
    doc = safeload.load_yaml_file(path)
    if not isinstance(doc, dict):
        raise InputError(file, None, "must be a mapping")
    if doc.get("schema") != SOURCES_SCHEMA:
        raise InputError(file, "schema", f"must be {SOURCES_SCHEMA!r}, got {doc.get('schema')!r}")
    tools = doc.get("tools")
    if not isinstance(tools, dict) or not tools:
        raise InputError(file, "tools", "must be a non-empty mapping of tool name to source")
    sources = {name: _tool(file, name, raw) for name, raw in tools.items()}
    if overrides is not None and not isinstance(overrides, Mapping):
        raise InputError(overrides_source, "gates_sources",
                         "must map a tool name to {url: ..., sha256: ...}")
    for name, raw in (overrides or {}).items():
        where = f"gates_sources.{name}"
        if name not in sources:
            raise InputError(overrides_source, where,
                             f"unknown tool (known: {', '.join(sources)})")
        if not isinstance(raw, dict) or set(raw) - {"url", "sha256"}:
            raise InputError(overrides_source, where,
                             "may only set 'url' (a mirror of the same pin) and 'sha256' "
                             "(the pin of an archive at that url)")
        url = raw.get("url")
        if not isinstance(url, str) or not _URL.match(url):
            raise InputError(overrides_source, f"{where}.url",
                             f"must be a URL or path, got {url!r}")
        sha = raw.get("sha256")
        if sha is None:
            sources[name] = _replace(sources[name], url=url)
            continue
        if not (isinstance(sha, str) and _HEX64.match(sha)):
            raise InputError(overrides_source, f"{where}.sha256",
                             f"must be 64 lowercase hex digits, got {sha!r}")
        sources[name] = _replace(sources[name], url=url, sha256=sha, commit=None, tag=None)
    return sources


def _replace(src: ToolSource, **changes: Any) -> ToolSource:
    return ToolSource(**{**asdict(src), "binaries": src.binaries, **changes})


def _tool(file: str, name: str, raw: Any) -> ToolSource:
    at = f"tools.{name}"
    if not isinstance(raw, dict):
        raise InputError(file, at, "must be a mapping")
    url, source = raw.get("url"), raw.get("source")
    if not isinstance(url, str) or not _URL.match(url):
        raise InputError(file, f"{at}.url", f"must be a URL, got {url!r}")
    if not isinstance(source, str) or not source.strip():
        raise InputError(file, f"{at}.source", "must say where the pin was found")
    commit, sha = raw.get("commit"), raw.get("sha256")
    if commit is None and sha is None:
        raise InputError(file, at, "needs a pinned 'commit' (40 hex) or an archive 'sha256'")
    if commit is not None and not (isinstance(commit, str) and _HEX40.match(commit)):
        raise InputError(file, f"{at}.commit", f"must be a full 40-hex commit id, got {commit!r}")
    if sha is not None and not (isinstance(sha, str) and _HEX64.match(sha)):
        raise InputError(file, f"{at}.sha256", f"must be 64 lowercase hex digits, got {sha!r}")
    binaries = raw.get("binaries", [])
    if not isinstance(binaries, list) or not all(isinstance(b, str) for b in binaries):
        raise InputError(file, f"{at}.binaries", "must be a list of names")
    build = raw.get("build", {})
    if not isinstance(build, dict):
        raise InputError(file, f"{at}.build", "must be a mapping")
    for key in ("tag", "version"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise InputError(file, f"{at}.{key}", "must be a string")
    return ToolSource(name=name, url=url, source=source, commit=commit, tag=raw.get("tag"),
                      sha256=sha, version=raw.get("version"), binaries=tuple(binaries),
                      build=build)


# ----------------------------------------------------------------------------- expectations


@dataclass(frozen=True)
class Check:
    """One figure a topology class is judged on (see expectations.yaml's header)."""

    metric: str
    unit: str
    tolerance: float
    source: str
    expected: float | None = None
    baseline: bool = False
    size_bytes: int | None = None
    gpus: int | None = None
    floor: float | None = None

    @property
    def better(self) -> str:
        return METRICS[self.metric][1]

    @property
    def key(self) -> str:
        """The figure's name in a record: ``all_reduce_busbw@2147483648``."""
        return figure_key(self.metric, self.size_bytes)


@dataclass(frozen=True)
class Expectations:
    classes: dict[str, tuple[Check, ...]]
    descriptions: dict[str, str]
    latency_ratio_max: float
    bidir_ratio_min: float
    p2p_margin: float


def figure_key(metric: str, size_bytes: int | None) -> str:
    return f"{metric}@{size_bytes}" if size_bytes is not None else metric


def load_expectations(path: str | Path = EXPECTATIONS_PATH) -> Expectations:
    """Read and check ``expectations.yaml``: known classes, metrics and units; 0-1 tolerances."""
    file = str(path)
    doc = safeload.load_yaml_file(path)
    if not isinstance(doc, dict):
        raise InputError(file, None, "must be a mapping")
    if doc.get("schema") != EXPECTATIONS_SCHEMA:
        raise InputError(file, "schema",
                         f"must be {EXPECTATIONS_SCHEMA!r}, got {doc.get('schema')!r}")
    classes = doc.get("classes")
    if not isinstance(classes, dict):
        raise InputError(file, "classes", "must be a mapping of topology class to checks")
    unknown = sorted(set(classes) - set(TOPOLOGY_CLASSES))
    if unknown:
        raise InputError(file, f"classes.{unknown[0]}",
                         f"unknown topology class (known: {', '.join(TOPOLOGY_CLASSES)})")
    missing = [c for c in TOPOLOGY_CLASSES if c not in classes]
    if missing:
        raise InputError(file, "classes", f"missing topology class {missing[0]!r}")
    parsed: dict[str, tuple[Check, ...]] = {}
    descriptions: dict[str, str] = {}
    for name, raw in classes.items():
        if not isinstance(raw, dict) or not isinstance(raw.get("checks"), list):
            raise InputError(file, f"classes.{name}.checks", "must be a list of checks")
        descriptions[name] = str(raw.get("description", ""))
        parsed[name] = tuple(_check(file, f"classes.{name}.checks[{i}]", c)
                             for i, c in enumerate(raw["checks"]))
    cons = doc.get("p2p_consistency") or {}
    choice = doc.get("choice") or {}
    return Expectations(
        classes=parsed, descriptions=descriptions,
        latency_ratio_max=_fraction(file, "p2p_consistency.latency_ratio_max",
                                    cons.get("latency_ratio_max")),
        bidir_ratio_min=_positive(file, "p2p_consistency.bidir_ratio_min",
                                  cons.get("bidir_ratio_min")),
        p2p_margin=_fraction(file, "choice.p2p_margin", choice.get("p2p_margin")),
    )


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _fraction(file: str, at: str, value: Any) -> float:
    if not _number(value) or not 0 <= value <= 1:
        raise InputError(file, at, f"must be a number from 0 to 1, got {value!r}")
    return float(value)


def _positive(file: str, at: str, value: Any) -> float:
    if not _number(value) or value <= 0:
        raise InputError(file, at, f"must be a positive number, got {value!r}")
    return float(value)


def _check(file: str, at: str, raw: Any) -> Check:
    if not isinstance(raw, dict):
        raise InputError(file, at, "must be a mapping")
    metric = raw.get("metric")
    if metric not in METRICS:
        raise InputError(file, f"{at}.metric",
                         f"unknown metric {metric!r} (known: {', '.join(METRICS)})")
    unit = raw.get("unit")
    if unit != METRICS[metric][0]:
        raise InputError(file, f"{at}.unit",
                         f"unknown unit {unit!r} for {metric} (must be {METRICS[metric][0]})")
    source = raw.get("source")
    if not isinstance(source, str) or not source.strip():
        raise InputError(file, f"{at}.source", "every figure needs a source")
    baseline = raw.get("baseline", False)
    if not isinstance(baseline, bool):
        raise InputError(file, f"{at}.baseline", "must be true or false")
    expected = raw.get("expected")
    if baseline == (expected is not None):
        raise InputError(file, at, "needs either 'expected' (a published figure) or "
                                   "'baseline: true' (no public figure), not both")
    if expected is not None:
        expected = _positive(file, f"{at}.expected", expected)
    size, gpus, floor = raw.get("size_bytes"), raw.get("gpus"), raw.get("floor")
    for key, value in (("size_bytes", size), ("gpus", gpus)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 1):
            raise InputError(file, f"{at}.{key}", f"must be a positive integer, got {value!r}")
    if floor is not None and METRICS[metric][1] != "higher":
        raise InputError(file, f"{at}.floor", f"only bandwidths have a floor, not {metric}")
    if not metric.startswith("p2p_") and size is None:
        raise InputError(file, f"{at}.size_bytes", f"{metric} is judged at a fixed size")
    return Check(metric=metric, unit=unit, source=source, baseline=baseline,
                 tolerance=_fraction(file, f"{at}.tolerance", raw.get("tolerance")),
                 expected=expected, size_bytes=size, gpus=gpus,
                 floor=None if floor is None else _positive(file, f"{at}.floor", floor))


# ----------------------------------------------------------------------------- topology


@dataclass(frozen=True)
class PcieLink:
    gen: int | None = None
    width: int | None = None


def pcie_link(doc: Mapping[str, Any]) -> PcieLink:
    """The weakest GPU link from a facts document's optional per-GPU nvidia-smi fields.

    ``pcie_link_gen_max`` / ``pcie_link_width_max`` (``nvidia-smi --query-gpu=
    pcie.link.gen.max,pcie.link.width.max``: what GPU and slot can train to; the
    ``current`` values drop at idle). The facts document does not gather them yet, so
    this is usually unknown.
    """
    gens, widths = [], []
    for gpu in doc.get("gpus") or []:
        if isinstance(gpu, dict):
            gen, width = gpu.get("pcie_link_gen_max"), gpu.get("pcie_link_width_max")
            if isinstance(gen, int) and not isinstance(gen, bool):
                gens.append(gen)
            if isinstance(width, int) and not isinstance(width, bool):
                widths.append(width)
    return PcieLink(min(gens) if gens else None, min(widths) if widths else None)


def topology_class(
    facts: HostFacts | Mapping[str, Any], measured_p2p: bool | None = None
) -> str | None:
    """The expectations class of a host; None when its topology is unknown.

    Every GPU pair on ``NV#`` -> NVLink (generation from the GPU name). Otherwise PCIe:
    with P2P when the measurement says so (``measured_p2p``), else when the driver's
    verdict is ``ok`` on bare metal; Gen5 x16 only when the facts carry the link fields.
    Mixed topologies (NVLink pairs or islands plus PCIe, e.g. H200 NVL) are judged as
    PCIe: their 8-GPU collectives run at the PCIe figure (gpu-gates.md §7).
    """
    link = PcieLink()
    if not isinstance(facts, HostFacts):
        link = pcie_link(facts)
        facts = HostFacts.from_dict(facts)
    nvlink = facts.topology.nvlink
    if nvlink is None and facts.topology.p2p is None and measured_p2p is None:
        return None
    if nvlink:
        names = [g.name or "" for g in facts.gpus]
        if names and all(_NVLINK4_NAMES.search(n) for n in names):
            return "nvlink4"
        return "nvlink-other"
    p2p = measured_p2p
    if p2p is None:
        p2p = facts.topology.p2p == "ok" and facts.is_vm is not True
    if not p2p:
        return "pcie-no-p2p"
    return "pcie5-x16-p2p" if (link.gen, link.width) == (5, 16) else "pcie-p2p"


# ----------------------------------------------------------------------------- figures


@dataclass(frozen=True)
class BusBw:
    """all_reduce busbw (GB/s) at one size, both halves of the nccl-tests row."""

    size_bytes: int
    out_of_place: float | None
    in_place: float | None

    @property
    def value(self) -> float | None:
        """The lower half: a gate must not pass on the better of two numbers."""
        halves = [v for v in (self.out_of_place, self.in_place) if v is not None]
        return min(halves) if halves else None


def busbw_at(result: NcclTestsResult, size_bytes: int) -> BusBw | None:
    """busbw of the row at exactly ``size_bytes``; None when the run has no such row.

    Not ``result.avg_busbw``: nccl-tests' "Avg bus bandwidth" is the mean over every
    printed row, small latency-bound sizes included (common.cu ``args->bw[0] += busBw``),
    so a sweep from 8 B reports a fraction of the link (gpu-gates.md §4-§5).
    """
    for row in result.rows:
        if row.size == size_bytes:
            oop, inp = row.out_of_place, row.in_place
            return BusBw(size_bytes, oop.busbw if oop else None, inp.busbw if inp else None)
    return None


def busbw_near(result: NcclTestsResult, size_bytes: int) -> BusBw | None:
    """busbw at ``size_bytes``, else at the largest row below it.

    all_gather_perf and alltoall_perf print the bytes they really moved: the count is
    split per rank and rounded down to 16 bytes (nccl-tests src/all_gather.cu and
    alltoall.cu, ``GetCollByteCount``), so on 6 or 7 GPUs the 2 GiB step prints
    2147483616 or 2147483632, never 2147483648; small steps print 0."""
    exact = busbw_at(result, size_bytes)
    if exact is not None:
        return exact
    below = [r.size for r in result.rows if 0 < r.size <= size_bytes]
    return busbw_at(result, max(below)) if below else None


def collective_figures(collective: str, result: NcclTestsResult, size_bytes: int,
                       latency_max_bytes: int = 1024) -> dict[str, float]:
    """``<collective>_busbw@<size>`` (:func:`busbw_near`, keyed by the asked size) and
    ``<collective>_latency@<max bytes>`` (:func:`small_latency_us`) of one run."""
    figures: dict[str, float] = {}
    bw = busbw_near(result, size_bytes)
    if bw is not None and bw.value is not None:
        figures[figure_key(f"{collective}_busbw", size_bytes)] = bw.value
    lat = small_latency_us(result, max_bytes=latency_max_bytes)
    if lat is not None:
        figures[figure_key(f"{collective}_latency", latency_max_bytes)] = lat
    return figures


def small_latency_us(
    result: NcclTestsResult, max_bytes: int = 1024, min_bytes: int = 8
) -> float | None:
    """The slowest all_reduce time (us) among sizes ``min_bytes..max_bytes``.

    Small messages are latency-bound, like decode's all-reduces (gpu-gates.md §5); per
    row the faster half counts (noise), over rows the slowest (the gate's worst case).
    """
    times = []
    for row in result.rows:
        if min_bytes <= row.size <= max_bytes:
            halves = [t.time_us for t in (row.out_of_place, row.in_place) if t is not None]
            if halves:
                times.append(min(halves))
    return max(times) if times else None


_NCCL_LIBRARY_RE = re.compile(r"nccl-library=(\d+)")
_NCCL_VERSION_RE = re.compile(r"NCCL version (\d+\.\d+\.\d+)")


def nccl_version(text: str) -> str | None:
    """The NCCL the run loaded, from nccl-tests' header or NCCL's own banner.

    nccl-tests >= 2.17 prints ``nccl-library=23007`` (NCCL_VERSION_CODE, major*10000 +
    minor*100 + patch since 2.9); older runs print ``NCCL version 2.20.3+cuda12.3`` and
    NCCL_DEBUG=INFO logs ``NCCL INFO NCCL version 2.27.3+cuda13.0``.
    """
    if m := _NCCL_LIBRARY_RE.search(text):
        code = int(m[1])
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    if m := _NCCL_VERSION_RE.search(text):
        return m[1]
    return None


def p2p_figures(report: P2PBandwidthReport) -> dict[str, float]:
    """The P2P=Enabled figures the expectations name, from a parsed p2pBandwidthLatencyTest."""
    figures: dict[str, float] = {}
    uni = _first(report, "unidirectional_enabled_writes", "unidirectional_enabled")
    if uni:
        figures["p2p_unidir_best"] = max(uni)
        figures["p2p_unidir_worst"] = min(uni)
    bidir = _first(report, "bidirectional_enabled")
    if bidir:
        figures["p2p_bidir_best"] = max(bidir)
    lat = _first(report, "latency_enabled_writes_gpu", "latency_enabled_gpu")
    if lat:
        figures["p2p_latency_worst"] = max(lat)
    return figures


def _first(report: P2PBandwidthReport, *keys: str) -> list[float]:
    for key in keys:
        if key in report.matrices:
            return off_diagonal(report.matrices[key])
    return []


# ----------------------------------------------------------------------------- choice


@dataclass(frozen=True)
class Measurement:
    """One all_reduce run under one env: busbw at the gate size, small-message latency."""

    busbw_gbs: float
    size_bytes: int
    latency_us: float | None = None
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Hang:
    """A run killed at its timeout: a result (the path does not work), not a stuck deploy."""

    tool: str
    timeout_s: float
    env: dict[str, str] = field(default_factory=dict)


def measurement_from(
    result: NcclTestsResult, size_bytes: int, env: Mapping[str, str] | None = None,
    latency_max_bytes: int = 1024,
) -> Measurement:
    """A :class:`Measurement` from a parsed run; an error when the gate size was not run."""
    bw = busbw_at(result, size_bytes)
    if bw is None or bw.value is None:
        sizes = ", ".join(str(r.size) for r in result.rows) or "none"
        raise InputError("nccl-tests output", "size",
                         f"no row at {size_bytes} bytes (sizes run: {sizes})")
    return Measurement(bw.value, size_bytes, small_latency_us(result, latency_max_bytes),
                       dict(env or {}))


@dataclass(frozen=True)
class NcclChoice:
    """The NCCL env and SGLang flag chosen from measurement, with why and the numbers."""

    p2p: bool
    env: dict[str, str]
    disable_custom_all_reduce: bool
    reason: str
    numbers: dict[str, Any]
    ready: bool = True  # False when no path worked (both hung)

    def to_dict(self) -> dict[str, Any]:
        """The ``measured_nccl`` entry of host.json, beside the driver's verdict."""
        return asdict(self)

    @property
    def sglang_flags(self) -> list[str]:
        return ["--disable-custom-all-reduce"] if self.disable_custom_all_reduce else []


_P2P_OFF = {"NCCL_P2P_DISABLE": "1"}


def _run_numbers(run: Measurement | Hang | None) -> dict[str, Any] | None:
    if run is None:
        return None
    if isinstance(run, Hang):
        return {"hang": True, "tool": run.tool, "timeout_s": run.timeout_s}
    return {"busbw_gbs": run.busbw_gbs, "size_bytes": run.size_bytes,
            "latency_us": run.latency_us}


def choose_nccl_env(
    driver_p2p: str | None,
    p2p_on: Measurement | Hang | None,
    p2p_off: Measurement | Hang,
    margin: float = 0.1,
) -> NcclChoice:
    """P2P stays on only when measured with P2P on and faster than P2P off by ``margin``.

    A hang, a P2P-on run that was not taken (driver verdict not ``ok``) or one that is
    not clearly faster keeps P2P off: ``NCCL_P2P_DISABLE=1`` and SGLang's
    ``--disable-custom-all-reduce`` (custom all-reduce needs P2P; sglang#4814). The
    latency counts too: a P2P path with a worse small-message latency loses, since
    decode's all-reduces are latency-bound (gpu-gates.md §5).
    """
    numbers = {"driver_p2p": driver_p2p, "p2p_on": _run_numbers(p2p_on),
               "p2p_off": _run_numbers(p2p_off), "margin": margin}

    def off(reason: str, ready: bool = True) -> NcclChoice:
        return NcclChoice(False, dict(_P2P_OFF), True, reason, numbers, ready)

    if isinstance(p2p_on, Measurement) and isinstance(p2p_off, Hang):
        return NcclChoice(True, {}, False, f"P2P off hung ({p2p_off.tool}, killed after "
                          f"{p2p_off.timeout_s:g} s); P2P on measured {p2p_on.busbw_gbs:g} "
                          "GB/s: P2P left on", numbers)
    if isinstance(p2p_off, Hang):
        why = "hung too" if isinstance(p2p_on, Hang) else "was not measured"
        return off(f"P2P off hung ({p2p_off.tool}, killed after {p2p_off.timeout_s:g} s) "
                   f"and P2P on {why}: no working collective path", ready=False)
    if driver_p2p != "ok":
        return off(f"driver P2P verdict is {driver_p2p or 'unknown'}: P2P not measured, "
                   f"P2P off ({p2p_off.busbw_gbs:g} GB/s)")
    if p2p_on is None:
        return off("P2P on was not measured: P2P off until a measurement shows it is faster")
    if isinstance(p2p_on, Hang):
        return off(f"P2P on hung ({p2p_on.tool}, killed after {p2p_on.timeout_s:g} s): "
                   f"P2P off ({p2p_off.busbw_gbs:g} GB/s)")
    if p2p_on.size_bytes != p2p_off.size_bytes:
        raise ValueError("P2P on and off were measured at different sizes: "
                         f"{p2p_on.size_bytes} vs {p2p_off.size_bytes}")
    gain = p2p_on.busbw_gbs / p2p_off.busbw_gbs - 1 if p2p_off.busbw_gbs > 0 else float("inf")
    numbers["gain"] = round(gain, 4)
    versus = f"{p2p_on.busbw_gbs:g} vs {p2p_off.busbw_gbs:g} GB/s at {p2p_on.size_bytes} B"
    if gain < margin:
        return off(f"P2P on is not faster by {margin:.0%} ({versus}, {gain:+.1%}): P2P off")
    lat_on, lat_off = p2p_on.latency_us, p2p_off.latency_us
    if lat_on is not None and lat_off is not None and lat_on > lat_off:
        return off(f"P2P on has more bandwidth ({versus}) but a worse small-message latency "
                   f"({lat_on:g} vs {lat_off:g} us): P2P off")
    return NcclChoice(True, {}, False, f"P2P on is faster ({versus}, {gain:+.1%}): "
                      "NCCL defaults, P2P left on", numbers)


# ----------------------------------------------------------------------------- verdicts


class GateStatus(StrEnum):
    """A gate's outcome (a StrEnum: records and output keep the word; a record read back
    compares equal as its plain string)."""

    PASS = "pass"
    FAIL = "fail"
    BASELINE = "baseline"  # no reference yet: this run becomes the host's baseline
    SKIP = "skip"  # the check does not apply (another GPU count)
    MISSING = "missing"  # the run has no such figure: counts as a failure


@dataclass(frozen=True)
class GateVerdict:
    """One gate's outcome with the numbers side by side.

    ``status``: ``pass``, ``fail``, ``baseline`` (no reference yet: this run becomes the
    host's baseline), ``skip`` (the check does not apply, e.g. another GPU count) or
    ``missing`` (the run has no such figure: counts as a failure).
    """

    check: str
    status: GateStatus
    message: str
    measured: float | None = None
    expected: float | None = None
    reference: str | None = None  # "expectation" | "baseline" | "floor"
    tolerance: float | None = None
    limit: float | None = None
    unit: str | None = None
    source: str | None = None

    @property
    def passed(self) -> bool:
        return self.status in (GateStatus.PASS, GateStatus.BASELINE, GateStatus.SKIP)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def judge(
    check: Check, measured: float | None, baseline: float | None = None,
    gpus: int | None = None,
) -> GateVerdict:
    """Judge one figure against the check's published figure, else the host's baseline."""
    name, unit = check.key, check.unit
    if check.gpus is not None and gpus is not None and gpus != check.gpus:
        return GateVerdict(name, GateStatus.SKIP,
                           f"figure is for {check.gpus} GPUs, run had {gpus}",
                           measured=measured, unit=unit, source=check.source)
    if measured is None:
        return GateVerdict(name, GateStatus.MISSING, "the run has no such figure", unit=unit,
                           source=check.source)
    reference, expected = "expectation", check.expected
    if expected is None:
        reference, expected = "baseline", baseline
    if check.floor is not None and measured < check.floor:
        return GateVerdict(name, GateStatus.FAIL, f"{measured:g} {unit} is below the floor "
                           f"{check.floor:g} {unit}", measured, expected, "floor",
                           check.tolerance, check.floor, unit, check.source)
    if expected is None:
        return GateVerdict(name, GateStatus.BASELINE, f"{measured:g} {unit}: no baseline "
                           "yet, this run becomes the host's baseline", measured, None, "baseline",
                           check.tolerance, check.floor, unit, check.source)
    if check.better == "higher":
        limit = expected * (1 - check.tolerance)
        ok, side = measured >= limit, "below"
    else:
        limit = expected * (1 + check.tolerance)
        ok, side = measured <= limit, "above"
    text = (f"{measured:g} {unit} vs {reference} {expected:g} {unit} "
            f"(tolerance {check.tolerance:.0%}, limit {limit:.4g})")
    return GateVerdict(name, GateStatus.PASS if ok else GateStatus.FAIL,
                       text if ok else f"{text}: {side} the limit", measured, expected,
                       reference, check.tolerance, round(limit, 6), unit, check.source)


def judge_hang(hang: Hang) -> GateVerdict:
    return GateVerdict(f"{hang.tool}:no_hang", GateStatus.FAIL,
                       f"{hang.tool} did not finish within {hang.timeout_s:g} s "
                       f"(env {_env_text(hang.env)})")


def _env_text(env: Mapping[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(env.items())) or "NCCL defaults"


def judge_gpus(result: NcclTestsResult, host_gpus: int) -> GateVerdict:
    """Did every GPU of the host take part? nccl-tests prints one ``# Rank`` line per rank."""
    devices = {(r.host, r.device) for r in result.ranks}
    if not result.ranks:
        return GateVerdict("gpus_present", GateStatus.MISSING, "the output has no '# Rank' lines",
                           expected=host_gpus)
    n = len(devices)
    ok = n == host_gpus
    return GateVerdict("gpus_present", GateStatus.PASS if ok else GateStatus.FAIL,
                       f"{n} of the host's {host_gpus} GPUs took part in the run",
                       measured=n, expected=host_gpus)


def judge_p2p_matrix(
    report: P2PBandwidthReport, p2p_expected: bool, expectations: Expectations
) -> GateVerdict:
    """Is P2P really working where it should (and absent where it should be)?

    Per GPU pair, the P2P=Enabled latency against P2P=Disabled (or, without latency
    tables, bidirectional bandwidth): with real P2P the latency falls from ~14 us to
    under 1 us. Enabled close to Disabled means the "P2P" path is the staged copy, i.e.
    P2P is not really working, whatever ``CAN Access Peer`` or ``topo -p2p`` say.
    """
    pairs = _p2p_pairs(report, expectations)
    if pairs is None:
        return GateVerdict("p2p_matrix_consistent", GateStatus.MISSING, "no P2P=Enabled/Disabled "
                           "latency or bidirectional matrices in the output")
    basis, working = pairs
    n_ok = sum(working)
    total = len(working)
    measured = f"{n_ok} of {total} GPU pairs behave as P2P ({basis})"
    if p2p_expected and n_ok < total:
        return GateVerdict("p2p_matrix_consistent", GateStatus.FAIL,
                           f"P2P expected but only {measured}", measured=n_ok, expected=total)
    if not p2p_expected and n_ok:
        return GateVerdict("p2p_matrix_consistent", GateStatus.FAIL,
                           f"P2P expected off but {measured}: the verdict is stale",
                           measured=n_ok, expected=0)
    return GateVerdict("p2p_matrix_consistent", GateStatus.PASS, measured,
                       measured=n_ok, expected=total if p2p_expected else 0)


def _p2p_pairs(
    report: P2PBandwidthReport, exp: Expectations
) -> tuple[str, list[bool]] | None:
    m = report.matrices
    on = m.get("latency_enabled_writes_gpu") or m.get("latency_enabled_gpu")
    off = m.get("latency_disabled_gpu")
    if on and off:
        ratios = [a / b if b > 0 else 1.0 for a, b in zip(off_diagonal(on), off_diagonal(off),
                                                          strict=True)]
        return (f"enabled/disabled latency <= {exp.latency_ratio_max:g}",
                [r <= exp.latency_ratio_max for r in ratios])
    on, off = m.get("bidirectional_enabled"), m.get("bidirectional_disabled")
    if on and off:
        ratios = [a / b if b > 0 else 0.0 for a, b in zip(off_diagonal(on), off_diagonal(off),
                                                          strict=True)]
        return (f"enabled/disabled bidirectional bandwidth >= {exp.bidir_ratio_min:g}",
                [r >= exp.bidir_ratio_min for r in ratios])
    return None


def gate_figures(
    checks: Iterable[Check], all_reduce: NcclTestsResult | None,
    p2p: P2PBandwidthReport | None = None,
    others: Mapping[str, NcclTestsResult] | None = None,
) -> dict[str, float]:
    """The figures a class's checks name (keyed by ``Check.key``) from the parsed runs;
    ``others``: all_gather / alltoall results by collective name (EP hosts)."""
    figures: dict[str, float] = {}
    p2p_values = p2p_figures(p2p) if p2p is not None else {}
    for c in checks:
        value: float | None = None
        collective, _, kind = c.metric.rpartition("_")
        if c.metric == "all_reduce_busbw" and all_reduce is not None and c.size_bytes:
            bw = busbw_at(all_reduce, c.size_bytes)
            value = bw.value if bw else None
        elif c.metric == "all_reduce_latency" and all_reduce is not None and c.size_bytes:
            value = small_latency_us(all_reduce, max_bytes=c.size_bytes)
        elif collective in (others or {}) and c.size_bytes and kind in ("busbw", "latency"):
            value = collective_figures(collective, others[collective],
                                       c.size_bytes, c.size_bytes).get(c.key)
        elif c.metric in p2p_values:
            value = p2p_values[c.metric]
        if value is not None:
            figures[c.key] = value
    return figures


def judge_class(
    exp: Expectations, topology: str, figures: Mapping[str, float], *,
    records: Iterable[Mapping[str, Any]] = (), host: str | None = None,
    gpus: int | None = None,
) -> list[GateVerdict]:
    """Every check of a class; baseline checks look up the host's earlier records."""
    records = list(records)
    verdicts = []
    for c in exp.classes[topology]:
        base = baseline_for(records, host, topology, c.key) if c.baseline and host else None
        verdicts.append(judge(c, figures.get(c.key), base, gpus))
    return verdicts


# ----------------------------------------------------------------------------- records


@dataclass(frozen=True)
class RecordHeader:
    """Whose measurement a record holds: the host, when, its topology class, the pinned
    tools' sources and the NCCL version the runs printed."""

    host: str
    timestamp: str
    topology: str | None
    sources: Mapping[str, ToolSource]
    nccl: str | None


def measure_record(
    header: RecordHeader, *, runs: Iterable[Mapping[str, Any]], figures: Mapping[str, float],
    choice: NcclChoice | None, verdicts: Iterable[GateVerdict],
) -> dict[str, Any]:
    """A ``gpuserve.measure/1`` document (one per measuring run, under results/<host>/).

    ``runs``: one entry per tool invocation: ``tool``, ``argv``, ``env``, ``gpus``,
    ``sizes`` and its ``figures``, or ``hang: {"timeout_s": ...}``. ``figures`` are the
    gate figures under the chosen env, keyed by :func:`figure_key`; the first record of a
    host is its baseline for the checks that have no published figure.
    """
    doc = {
        "schema": MEASURE_SCHEMA, "host": header.host, "timestamp": header.timestamp,
        "topology_class": header.topology,
        "tools": {name: {"commit": s.commit, "sha256": s.sha256, "version": s.version,
                         "url": s.url} for name, s in sorted(header.sources.items())},
        "nccl_version": header.nccl, "runs": [dict(r) for r in runs],
        "figures": dict(figures),
        "choice": choice.to_dict() if choice else None,
        "verdicts": [v.to_dict() for v in verdicts],
    }
    validate_measure_record(doc, "<record>")
    return doc


def validate_measure_record(doc: Any, file: str | Path) -> dict[str, Any]:
    """Check the keys a reader relies on; errors name the file and the field."""
    if not isinstance(doc, dict):
        raise InputError(file, None, "must be a JSON object")
    if doc.get("schema") != MEASURE_SCHEMA:
        raise InputError(file, "schema", f"must be {MEASURE_SCHEMA!r}, got {doc.get('schema')!r}")
    for key in ("host", "timestamp"):
        if not isinstance(doc.get(key), str) or not doc[key]:
            raise InputError(file, key, "must be a non-empty string")
    if doc.get("topology_class") not in (None, *TOPOLOGY_CLASSES):
        raise InputError(file, "topology_class", f"unknown class {doc['topology_class']!r}")
    figures = doc.get("figures")
    if not isinstance(figures, dict) or not all(
        isinstance(k, str) and k.split("@")[0] in METRICS and _number(v)
        for k, v in figures.items()
    ):
        raise InputError(file, "figures", "must map '<metric>[@<size>]' to numbers")
    if not isinstance(doc.get("runs"), list) or not isinstance(doc.get("verdicts"), list):
        raise InputError(file, "runs", "runs and verdicts must be lists")
    return doc


def measure_record_path(results_dir: str | Path, doc: Mapping[str, Any]) -> Path:
    stamp = str(doc["timestamp"]).replace("-", "").replace(":", "")
    return Path(results_dir) / safe_name(str(doc["host"])) / f"{stamp}-measure-gates.json"


def write_measure_record(results_dir: str | Path, doc: Mapping[str, Any]) -> Path:
    """One file per run, never overwritten, written then renamed (like results.py)."""
    text = json.dumps(validate_measure_record(dict(doc), "<record>"), sort_keys=True) + "\n"
    return write_new_file(measure_record_path(results_dir, doc), text)


def read_measure_records(host_dir: str | Path) -> list[dict[str, Any]]:
    """Every ``gpuserve.measure/1`` record in a directory, oldest first; others skipped."""
    records = []
    for path in sorted(Path(host_dir).glob("*.json")):
        doc = safeload.load_json_file(path)
        if isinstance(doc, dict) and doc.get("schema") == MEASURE_SCHEMA:
            records.append(validate_measure_record(doc, path))
    return sorted(records, key=lambda d: d["timestamp"])


def baseline_for(
    records: Iterable[Mapping[str, Any]], host: str, topology: str, key: str
) -> float | None:
    """The host's baseline for a figure: its first record of this class that has it and
    did not fail it."""
    for doc in sorted(records, key=lambda d: str(d.get("timestamp"))):
        if doc.get("host") != host or doc.get("topology_class") != topology \
                or key not in (doc.get("figures") or {}):
            continue
        if any(isinstance(v, dict) and v.get("check") == key and v.get("status") == GateStatus.FAIL
               for v in doc.get("verdicts") or []):
            continue  # a run that failed (e.g. below the floor) is no baseline
        return float(doc["figures"][key])
    return None


def _p2p_result(choice: Mapping[str, Any]) -> str | None:
    """What the measurement made of P2P: ``ok`` (kept on), ``hung`` (a P2P-path run was
    killed at its timeout), ``slower`` (measured, not faster by the margin or worse
    latency), ``not_measured`` (the driver's verdict or a VM ruled the P2P run out)."""
    p2p = choice.get("p2p")
    if not isinstance(p2p, bool):
        return None
    if p2p:
        return "ok"
    on = (choice.get("numbers") or {}).get("p2p_on")
    if isinstance(on, dict) and on.get("hang") or " hung" in str(choice.get("reason", "")):
        return "hung"
    return "slower" if isinstance(on, dict) else "not_measured"


def _number_or_none(value: Any) -> float | None:
    return float(value) if _number(value) else None


def measured_section(doc: Mapping[str, Any], path: str | Path | None = None) -> dict[str, Any]:
    """The host-facts document's optional ``measured`` section, from the host's
    ``/etc/gpuserve/measured.json`` (gathered with the document, gpuserve.facts.document)
    or from a ``gpuserve.measure/1`` record: both carry ``choice``, ``figures``,
    ``topology_class`` and ``verdicts``.

    What the doctor reads (gpuserve/doctor/rules.py): the P2P choice and why
    (``p2p_result``: ok | hung | slower | not_measured), the NCCL env chosen, the driver's
    P2P verdict it was measured under (a different verdict now makes it stale), the
    all-reduce busbw at the gate size beside its expectation or baseline, and the checks
    that failed, with their numbers."""
    choice = doc.get("choice") if isinstance(doc.get("choice"), dict) else {}
    numbers = choice.get("numbers") if isinstance(choice.get("numbers"), dict) else {}
    on = numbers.get("p2p_on") if isinstance(numbers.get("p2p_on"), dict) else None
    figures = doc.get("figures") if isinstance(doc.get("figures"), dict) else {}
    verdicts = [v for v in doc.get("verdicts") or [] if isinstance(v, dict)
                and isinstance(v.get("check"), str)]
    busbw_key = next((k for k in sorted(figures) if k.startswith("all_reduce_busbw@")), None)
    busbw_verdict = next((v for v in verdicts if v["check"].startswith("all_reduce_busbw@")),
                         None)
    if busbw_key is None and busbw_verdict is not None:
        busbw_key = busbw_verdict["check"]
    size = busbw_key.split("@", 1)[1] if busbw_key else None
    failed = [{"check": v["check"], "status": str(v.get("status")),
               "message": str(v.get("message", "")),
               "measured": _number_or_none(v.get("measured")),
               "expected": _number_or_none(v.get("expected")),
               "limit": _number_or_none(v.get("limit")),
               "unit": v.get("unit") if isinstance(v.get("unit"), str) else None}
              for v in verdicts if v.get("status") in (GateStatus.FAIL, GateStatus.MISSING)
              and v["check"].split("@")[0] in METRICS]
    env = choice.get("env") if isinstance(choice.get("env"), dict) else None
    problems = doc.get("problems")
    ready = doc.get("ready")
    if not isinstance(ready, bool):  # a record: ready when no figure or GPU check failed
        ready = None
    driver_p2p = numbers.get("driver_p2p")
    return {
        "state": "measured",
        "p2p": choice.get("p2p") if isinstance(choice.get("p2p"), bool) else None,
        "p2p_hang": bool(on.get("hang")) if on else None,
        "p2p_result": _p2p_result(choice),
        "env": None if env is None else {str(k): str(v) for k, v in env.items()},
        "disable_custom_all_reduce": choice.get("disable_custom_all_reduce")
        if isinstance(choice.get("disable_custom_all_reduce"), bool) else None,
        "reason": choice.get("reason") if isinstance(choice.get("reason"), str) else None,
        "driver_p2p": driver_p2p if driver_p2p in ("ok", "none", "partial") else None,
        "topology_class": doc.get("topology_class")
        if doc.get("topology_class") in TOPOLOGY_CLASSES else None,
        "all_reduce_busbw_gbs": _number_or_none(figures.get(busbw_key)) if busbw_key else None,
        "all_reduce_size_bytes": int(size) if size and size.isdigit() else None,
        "all_reduce_expected_gbs": _number_or_none((busbw_verdict or {}).get("expected")),
        "all_reduce_limit_gbs": _number_or_none((busbw_verdict or {}).get("limit")),
        "all_reduce_status": str(busbw_verdict["status"]) if busbw_verdict else None,
        "ready": ready,
        "problems": [str(p) for p in problems] if isinstance(problems, list) else [],
        "failed": failed,
        "record": str(path) if path is not None else None,
    }
