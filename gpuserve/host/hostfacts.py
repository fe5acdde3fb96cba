"""The host-facts document (docs/architecture.md) as typed objects for the doctor.

The document is produced by ``gpuserve.facts.document`` from one SSH round trip, or
written by hand for a box we cannot reach; either way it is input, so it is checked
field by field and a bad value is reported by its JSON path (``gpus[3].compute_cap``)
rather than surfacing later as a KeyError inside a rule. Missing tools give ``null``,
which is never an error: rules treat ``None`` as "unknown" and stay silent.

Keys this module does not know are ignored, so the facts side can add keys (such as
``cpu_vendor``) before the doctor uses them.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpuserve import safeload
from gpuserve.errors import InputError
from gpuserve.host.container import CONTAINER_NAMES

_NVLINK = re.compile(r"^NV\d+$")


class _Reader:
    """Typed access to one JSON object, reporting errors by file and dotted path."""

    def __init__(self, data: Any, path: str, file: str | None) -> None:
        self.file = file
        self.path = path
        if not isinstance(data, dict):
            raise InputError(file, path or None, f"must be an object, got {_kind(data)}")
        self.data = data

    def _at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, *types: type, choices: tuple | None = None,
            minimum: int | None = None) -> Any:
        value = self.data.get(key)
        if value is None:
            return None
        if (minimum is not None and isinstance(value, int) and not isinstance(value, bool)
                and value < minimum):  # a count or a size: -1 MiB is no GPU
            raise InputError(self.file, self._at(key), f"must be at least {minimum}, got "
                             f"{value}")
        if isinstance(value, bool) and bool not in types:
            raise InputError(self.file, self._at(key), f"must be {_names(types)}, got {value!r}")
        if not isinstance(value, types):
            raise InputError(self.file, self._at(key),
                             f"must be {_names(types)}, got {_kind(value)}")
        if choices is not None and value not in choices:
            raise InputError(self.file, self._at(key), f"must be one of "
                             f"{', '.join(map(str, choices))} or null, got {value!r}")
        return value

    def child(self, key: str) -> _Reader:
        value = self.data.get(key)
        return _Reader({} if value is None else value, self._at(key), self.file)

    def matrix(self, key: str) -> list[list[str]] | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(
            isinstance(row, list) and all(isinstance(c, str) for c in row) for row in value
        ):
            raise InputError(self.file, self._at(key), "must be a list of rows of strings")
        return [list(row) for row in value]


def _names(types: tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "true/false"}
    return " or ".join(names.get(t, t.__name__) for t in types)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string"}.get(type(value), repr(value))


@dataclass(frozen=True)
class Gpu:
    index: int | None = None
    name: str | None = None
    uuid: str | None = None
    bus_id: str | None = None
    memory_total_mib: int | None = None
    #: optional (``nvidia-smi --query-gpu=memory.used``): memory other processes hold,
    #: for SGLang's start-up balance check. None when not gathered.
    memory_used_mib: int | None = None
    driver_version: str | None = None
    compute_cap: str | None = None
    persistence_mode: str | None = None

    @property
    def sm_major(self) -> int | None:
        """Compute capability major (12 for SM120), None when unknown."""
        if not self.compute_cap:
            return None
        try:
            return int(self.compute_cap.split(".")[0])
        except ValueError:
            return None

    @property
    def memory_free_mib(self) -> int | None:
        if self.memory_total_mib is None or self.memory_used_mib is None:
            return None
        return self.memory_total_mib - self.memory_used_mib


@dataclass(frozen=True)
class Topology:
    links: list[list[str]] | None = None
    p2p_read: list[list[str]] | None = None
    p2p_write: list[list[str]] | None = None
    p2p: str | None = None  # "ok" | "none" | "partial"

    @property
    def nvlink(self) -> bool | None:
        """True when every GPU pair is joined by NVLink (``NV#`` cells), None if unknown."""
        if not self.links:
            return None
        cells = [c.strip() for i, row in enumerate(self.links) for j, c in enumerate(row)
                 if i != j and j < len(self.links)]
        return bool(cells) and all(_NVLINK.match(c) for c in cells)


@dataclass(frozen=True)
class Driver:
    version: str | None = None
    flavour: str | None = None  # "open" | "proprietary"

    @property
    def major(self) -> int | None:
        return _major(self.version)


@dataclass(frozen=True)
class Cuda:
    toolkit: str | None = None


@dataclass(frozen=True)
class Kernel:
    cmdline: str | None = None
    iommu: str | None = None
    iommu_groups: int | None = None
    boot_loader: str | None = None
    secure_boot: bool | None = None
    nouveau_loaded: bool | None = None


@dataclass(frozen=True)
class MeasuredCheck:
    """One check of the last measurement that did not pass, with its numbers."""

    check: str
    status: str  # "fail" | "missing"
    message: str = ""
    measured: float | None = None
    expected: float | None = None  # the published figure or the host's baseline
    limit: float | None = None
    unit: str | None = None


MEASURED_STATES = ("measured", "none")
P2P_RESULTS = ("ok", "hung", "slower", "not_measured")


@dataclass(frozen=True)
class Measured:
    """Optional: what the last measuring run found (gpuserve.measure.gates).

    The driver's ``topo -p2p`` verdict is what the driver claims; this is what the box
    did. ``p2p``: the NCCL env was chosen with P2P on (P2P measured working and faster);
    False when a hang or a slower P2P path kept it off (``p2p_result``: ok, hung, slower,
    not_measured when the driver's verdict or a VM ruled the P2P run out). ``state``
    ``none``: the document looked for ``/etc/gpuserve/measured.json`` and the host has
    none (never measured, or ``gates: off``). The section is absent in documents written
    before measuring existed or by hand, and then no rule reads it.
    """

    p2p: bool | None = None
    p2p_hang: bool | None = None
    all_reduce_busbw_gbs: float | None = None
    record: str | None = None  # the measured.json or gpuserve.measure/1 record read
    state: str = "measured"
    p2p_result: str | None = None
    env: dict[str, str] | None = None  # the NCCL env chosen from measurement
    disable_custom_all_reduce: bool | None = None
    reason: str | None = None
    driver_p2p: str | None = None  # the driver's verdict when it was measured
    topology_class: str | None = None
    all_reduce_size_bytes: int | None = None
    all_reduce_expected_gbs: float | None = None
    all_reduce_limit_gbs: float | None = None
    all_reduce_status: str | None = None  # pass | fail | baseline | skip | missing
    ready: bool | None = None
    problems: tuple[str, ...] = ()
    failed: tuple[MeasuredCheck, ...] = ()

    def stale(self, driver_p2p: str | None) -> bool:
        """Measured under another driver P2P verdict than the host reports now (another
        box, an ACS or IOMMU change): roles/nccl then follows the driver again."""
        return (self.state == "measured" and self.driver_p2p is not None
                and driver_p2p is not None and self.driver_p2p != driver_p2p)


@dataclass(frozen=True)
class HostFacts:
    hostname: str | None = None
    virtualization: str | None = None
    gpus: list[Gpu] = field(default_factory=list)
    topology: Topology = field(default_factory=Topology)
    driver: Driver = field(default_factory=Driver)
    cuda: Cuda = field(default_factory=Cuda)
    kernel: Kernel = field(default_factory=Kernel)
    sglang_version: str | None = None
    measured: Measured | None = None
    #: each GPU's fabric registration ({"bus_id", "state", "status"}; NVSwitch hosts),
    #: None when not gathered
    fabric: tuple[dict[str, str | None], ...] | None = None
    #: host.json's ``rdma`` block as roles/rdma records it (devices[] per port, the
    #: GPUs' NUMA nodes, GPUDirect); None when not gathered
    rdma: dict[str, Any] | None = None
    source: str | None = field(default=None, compare=False)

    # ---- derived views the rules share

    @property
    def is_vm(self) -> bool | None:
        if self.virtualization is None:
            return None
        return (self.virtualization not in ("none", "")
                and self.virtualization not in CONTAINER_NAMES)

    @property
    def sm_majors(self) -> set[int]:
        return {g.sm_major for g in self.gpus if g.sm_major is not None}

    @property
    def compute_caps(self) -> set[str]:
        return {g.compute_cap for g in self.gpus if g.compute_cap}

    @property
    def min_memory_mib(self) -> int | None:
        sizes = [g.memory_total_mib for g in self.gpus if g.memory_total_mib is not None]
        return min(sizes) if sizes else None

    @property
    def driver_version(self) -> str | None:
        return self.driver.version or next(
            (g.driver_version for g in self.gpus if g.driver_version), None)

    # ---- (de)serialisation

    def unknown(self) -> list[str]:
        """The areas the document says nothing about: the rules that need them cannot
        fire, so "no findings" means "none among what is known" (the doctor says so)."""
        areas = {
            "hostname": self.hostname is None,
            "virtualization": self.virtualization is None,
            "gpus": not self.gpus,
            "topology": self.topology == Topology(),
            "driver": self.driver_version is None and self.driver.flavour is None,
            "cuda": self.cuda.toolkit is None,
            "kernel": self.kernel == Kernel(),
            "sglang_version": self.sglang_version is None,
        }
        return [name for name, missing in areas.items() if missing]

    @classmethod
    def from_dict(cls, data: Any, file: str | Path | None = None) -> HostFacts:
        """The document, typed; every problem an InputError naming the file and field.
        Unknown keys and nulls are accepted (a tool missing on the host gives null; newer
        documents may carry more); :meth:`unknown` says what the document left out."""
        f = str(file) if file is not None else None
        root = _Reader(data, "", f)
        gpus_raw = root.data.get("gpus") or []
        if not isinstance(gpus_raw, list):
            raise InputError(f, "gpus", f"must be a list, got {_kind(gpus_raw)}")
        gpus = []
        for index, raw in enumerate(gpus_raw):
            g = _Reader(raw, f"gpus[{index}]", f)
            gpus.append(Gpu(
                index=g.get("index", int, minimum=0), name=g.get("name", str),
                uuid=g.get("uuid", str), bus_id=g.get("bus_id", str),
                memory_total_mib=g.get("memory_total_mib", int, minimum=0),
                memory_used_mib=g.get("memory_used_mib", int, minimum=0),
                driver_version=g.get("driver_version", str),
                compute_cap=_cap(g), persistence_mode=g.get("persistence_mode", str),
            ))
        t = root.child("topology")
        d, c, k = root.child("driver"), root.child("cuda"), root.child("kernel")
        return cls(
            hostname=root.get("hostname", str),
            virtualization=root.get("virtualization", str),
            gpus=gpus,
            topology=Topology(
                links=t.matrix("links"), p2p_read=t.matrix("p2p_read"),
                p2p_write=t.matrix("p2p_write"),
                p2p=t.get("p2p", str, choices=("ok", "none", "partial")),
            ),
            driver=Driver(version=d.get("version", str),
                          flavour=d.get("flavour", str, choices=("open", "proprietary"))),
            cuda=Cuda(toolkit=_version_text(c, "toolkit")),
            kernel=Kernel(
                cmdline=k.get("cmdline", str), iommu=k.get("iommu", str, choices=("on", "off")),
                iommu_groups=k.get("iommu_groups", int, minimum=0),
                boot_loader=k.get("boot_loader", str), secure_boot=k.get("secure_boot", bool),
                nouveau_loaded=k.get("nouveau_loaded", bool),
            ),
            sglang_version=root.get("sglang_version", str),
            measured=_measured(root),
            fabric=_fabric(root),
            rdma=_rdma(root),
            source=f,
        )

    @classmethod
    def from_json(
        cls, text: str, file: str | Path | None = None, host: str | None = None
    ) -> HostFacts:
        """Read the document, or pyinfra's ``--json fact`` output that wraps it.

        ``pyinfra --json INVENTORY fact gpuserve.facts.document.HostFactsDocument``
        prints ``{"<fact>": {"<host>": {...document...}}}``; that form is unwrapped, so
        its output can be saved and passed as it is. With several hosts in it, ``host``
        says which one.
        """
        data = safeload.loads_json(text, file)  # bounded size/depth, finite numbers
        return cls.from_dict(_unwrap_pyinfra_fact(data, file, host), file)

    @classmethod
    def from_file(cls, path: str | Path, host: str | None = None) -> HostFacts:
        return cls.from_json(safeload.read_text(path, safeload.DATA.max_bytes), path, host)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("source")
        if data["measured"] is None:
            data.pop("measured")  # optional section: documents without it stay as they were
        if data["fabric"] is None:
            data.pop("fabric")  # the same
        else:
            data["fabric"] = list(data["fabric"])
        if data["rdma"] is None:
            data.pop("rdma")  # the same
        return data


def _measured(root: _Reader) -> Measured | None:
    if root.data.get("measured") is None:
        return None
    m = root.child("measured")

    def number(r: _Reader, key: str) -> float | None:
        value = r.get(key, float, int)
        return None if value is None else float(value)

    env = m.child("env")
    if any(not isinstance(v, str) for v in env.data.values()):
        raise InputError(m.file, f"{m.path}.env", "must map names to strings")
    problems = m.data.get("problems") or []
    if not isinstance(problems, list | tuple) or not all(isinstance(p, str) for p in problems):
        raise InputError(m.file, f"{m.path}.problems", "must be a list of strings")
    failed_raw = m.data.get("failed") or []
    if not isinstance(failed_raw, list | tuple):
        raise InputError(m.file, f"{m.path}.failed", f"must be a list, got {_kind(failed_raw)}")
    failed = []
    for index, raw in enumerate(failed_raw):
        c = _Reader(raw, f"{m.path}.failed[{index}]", m.file)
        check, status = c.get("check", str), c.get("status", str)
        if check is None or status is None:
            raise InputError(m.file, c.path, "needs 'check' and 'status'")
        failed.append(MeasuredCheck(check, status, c.get("message", str) or "",
                                    number(c, "measured"), number(c, "expected"),
                                    number(c, "limit"), c.get("unit", str)))
    return Measured(
        p2p=m.get("p2p", bool), p2p_hang=m.get("p2p_hang", bool),
        all_reduce_busbw_gbs=number(m, "all_reduce_busbw_gbs"), record=m.get("record", str),
        state=m.get("state", str, choices=MEASURED_STATES) or "measured",
        p2p_result=m.get("p2p_result", str, choices=P2P_RESULTS),
        env=None if m.data.get("env") is None else dict(env.data),
        disable_custom_all_reduce=m.get("disable_custom_all_reduce", bool),
        reason=m.get("reason", str),
        driver_p2p=m.get("driver_p2p", str, choices=("ok", "none", "partial")),
        topology_class=m.get("topology_class", str),
        all_reduce_size_bytes=m.get("all_reduce_size_bytes", int, minimum=1),
        all_reduce_expected_gbs=number(m, "all_reduce_expected_gbs"),
        all_reduce_limit_gbs=number(m, "all_reduce_limit_gbs"),
        all_reduce_status=m.get("all_reduce_status", str),
        ready=m.get("ready", bool), problems=tuple(problems), failed=tuple(failed))


def _cap(g: _Reader) -> str | None:
    value = g.get("compute_cap", str)
    if value is not None and not re.fullmatch(r"\d+\.\d+", value):
        raise InputError(g.file, f"{g.path}.compute_cap", f"must look like '12.0', got {value!r}")
    return value


def _version_text(r: _Reader, key: str) -> str | None:
    """A version written as a string; a bare JSON number like 13.0 is accepted too."""
    value = r.get(key, str, float, int)
    return None if value is None else str(value)


def _major(version: str | None) -> int | None:
    if not version:
        return None
    match = re.match(r"(\d+)", version)
    return int(match.group(1)) if match else None


PYINFRA_FACT_NAME = "gpuserve.facts.document.HostFactsDocument"


def _unwrap_pyinfra_fact(data: Any, file: str | Path | None, host: str | None) -> Any:
    """``{"<fact>": {"<host>": doc}}`` (pyinfra --json) -> ``doc``; anything else as is."""
    if not (isinstance(data, dict) and set(data) == {PYINFRA_FACT_NAME}):
        if host is not None:
            raise InputError(file, None, f"--host {host}: this is a single host's document, "
                                         "not pyinfra's fact output")
        return data
    hosts = data[PYINFRA_FACT_NAME]
    if not isinstance(hosts, dict) or not hosts:
        raise InputError(file, PYINFRA_FACT_NAME, "holds no host")
    if host is None:
        if len(hosts) > 1:
            raise InputError(file, PYINFRA_FACT_NAME,
                             f"holds {len(hosts)} hosts ({', '.join(sorted(hosts))}): "
                             "choose one with --host")
        host = next(iter(hosts))
    if host not in hosts:
        raise InputError(file, PYINFRA_FACT_NAME,
                         f"no host {host!r} (hosts: {', '.join(sorted(hosts))})")
    if hosts[host] is None:
        raise InputError(file, f"{PYINFRA_FACT_NAME}.{host}",
                         "pyinfra gathered no document for this host (did the fact fail?)")
    return hosts[host]


def _rdma(root: _Reader) -> dict[str, Any] | None:
    """The ``rdma`` block, its devices typed (name, port, state, link_layer, numa_node,
    gids[] with type); other keys kept as they are."""
    raw = root.data.get("rdma")
    if raw is None:
        return None
    r = _Reader(raw, "rdma", root.file)
    devices_raw = r.data.get("devices") or []
    if not isinstance(devices_raw, list):
        raise InputError(root.file, "rdma.devices", f"must be a list, got {_kind(devices_raw)}")
    devices = []
    for i, item in enumerate(devices_raw):
        d = _Reader(item, f"rdma.devices[{i}]", root.file)
        gids = d.data.get("gids") or []
        if not isinstance(gids, list):
            raise InputError(root.file, f"rdma.devices[{i}].gids", "must be a list")
        devices.append({"name": d.get("name", str), "port": d.get("port", int, minimum=0),
                        "state": d.get("state", str), "link_layer": d.get("link_layer", str),
                        "phys_state": d.get("phys_state", str),
                        "numa_node": d.get("numa_node", int, minimum=0),
                        "gids": [{"index": _Reader(g, f"rdma.devices[{i}].gids[{j}]",
                                                   root.file).get("index", int, minimum=0),
                                  "type": g.get("type") if isinstance(g.get("type"), str)
                                  else None} for j, g in enumerate(gids)]})
    nodes = r.data.get("gpu_numa_nodes") or []
    if not isinstance(nodes, list) or not all(isinstance(n, int) for n in nodes):
        raise InputError(root.file, "rdma.gpu_numa_nodes", "must be a list of integers")
    return {**r.data, "devices": devices, "gpu_numa_nodes": nodes}


def _fabric(root: _Reader) -> tuple[dict[str, str | None], ...] | None:
    raw = root.data.get("fabric")
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise InputError(root.file, "fabric", f"must be a list, got {_kind(raw)}")
    out = []
    for i, item in enumerate(raw):
        r = _Reader(item, f"fabric[{i}]", root.file)
        out.append({"bus_id": r.get("bus_id", str), "state": r.get("state", str),
                    "status": r.get("status", str)})
    return tuple(out)
