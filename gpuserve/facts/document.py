"""The doctor's host-facts document, gathered in one SSH round trip.

pyinfra's ShortFactBase can only post-process a single other fact, so the document is
one fact whose command is a shell script: each tool's output follows a section marker
(``gpuserve.parsers.sections``) and is parsed by the same pure parsers the individual
facts use. A tool that is missing leaves its section empty, which gives ``null``.

CLI: ``pyinfra inventory/gpu.py fact gpuserve.facts.document.HostFactsDocument``
(add ``--sudo`` so lspci/mokutil can read what they need).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pyinfra.api import FactBase, QuoteString, StringCommand

from gpuserve import safeload
from gpuserve.errors import InputError
from gpuserve.facts.base import complete_jobs, in_parallel, logger, print_file, quiet
from gpuserve.facts.gpu import CUDA_TOOLKIT_COMMAND, NVIDIA_DRIVER_COMMAND, driver_from_sections
from gpuserve.facts.host import BOOT_EVIDENCE_COMMAND, IOMMU_COMMAND, IOMMU_MARKER
from gpuserve.host.hostfacts import HostFacts
from gpuserve.host.nccl_env import HOST_JSON_PATH
from gpuserve.host.rdma_pairs import PAIRS_PATH
from gpuserve.measure.gate_runs import MEASURED_JSON, read_measured
from gpuserve.measure.gates import measured_section
from gpuserve.parsers import (
    bootloader,
    cpuinfo,
    cuda,
    iommu,
    mokutil,
    nvidia_smi,
    proc_cmdline,
    proc_modules,
    systemd_detect_virt,
)
from gpuserve.parsers.sections import marker, split_sections

T = TypeVar("T")
UNREADABLE = "##gpuserve-unreadable##"


def _if_tool(tool: str, command: str) -> str:
    """Run ``command`` only where ``tool`` is on PATH (else the section stays empty)."""
    return f"if command -v {tool} >/dev/null 2>&1; then {command}; fi"


# (section, shell command); commands must exit 0 and print nothing when a tool is absent.
# Files are printed with builtins (print_file), not cat: this document is in every
# deploy's first batch, where each process costs tens of ms on a slow host.
_SECTIONS: tuple[tuple[str, str], ...] = (
    ("hostname", print_file("/proc/sys/kernel/hostname")),  # uname -n's nodename
    ("virt", _if_tool("systemd-detect-virt", "systemd-detect-virt 2>/dev/null || true")),
    ("gpus", _if_tool("nvidia-smi", quiet(nvidia_smi.QUERY_COMMAND))),
    ("topo", _if_tool("nvidia-smi", quiet("nvidia-smi topo -m"))),
    ("p2p_r", _if_tool("nvidia-smi", quiet("nvidia-smi topo -p2p r"))),
    ("p2p_w", _if_tool("nvidia-smi", quiet("nvidia-smi topo -p2p w"))),
    # NVSwitch hosts: each GPU's fabric registration (drivers without the fields print
    # an error and exit non-zero: the section stays empty)
    ("fabric", _if_tool("nvidia-smi", quiet(nvidia_smi.FABRIC_QUERY_COMMAND))),
    ("driver", NVIDIA_DRIVER_COMMAND),  # prints its own proc/dpkg sub-sections
    ("cuda", CUDA_TOOLKIT_COMMAND),
    ("cmdline", f"{print_file('/proc/cmdline')}; true"),
    ("iommu", IOMMU_COMMAND),
    ("boot", BOOT_EVIDENCE_COMMAND),
    ("secure_boot", _if_tool("mokutil", "mokutil --sb-state 2>&1 || true")),
    ("modules", "cat /proc/modules 2>/dev/null"),  # 5-15 KB: cat is cheaper there
    ("cpu", "{ while IFS= read -r _l; do case \"$_l\" in vendor_id*) "
            "printf '%s\\n' \"$_l\"; break ;; esac; done < /proc/cpuinfo; } 2>/dev/null; true"),
    # the measuring stage's last result (roles/gpu_gates): read here, in the same command,
    # so the doctor sees what the box did beside what the driver claims
    ("measured", f"if [ -e {MEASURED_JSON} ]; then {print_file(MEASURED_JSON)} "
                 f"|| echo '{UNREADABLE}'; fi"),
    # the host deploy's record (roles/rdma writes its ``rdma`` block): the RDMA rules
    ("host_json", f"if [ -e {HOST_JSON_PATH} ]; then cat {HOST_JSON_PATH} 2>/dev/null "
                  f"|| echo '{UNREADABLE}'; fi"),
    # the pair measurement's figures on a client host (roles/rdma/pairs.py): rdma.pairs
    ("rdma_pairs", f"if [ -e {PAIRS_PATH} ]; then cat {PAIRS_PATH} 2>/dev/null "
                   f"|| echo '{UNREADABLE}'; fi"),
)
SECTION_NAMES = tuple(name for name, _ in _SECTIONS) + ("sglang",)
_NVIDIA_SMI_SECTIONS = ("gpus", "topo", "p2p_r", "p2p_w", "fabric")
DOC_PREFIX = "_doc"  # the document's shell functions and job frame (in_parallel)

# Reads the installed distribution's version without importing sglang (which would
# initialise torch/CUDA); prints nothing when sglang is not installed.
_SGLANG_VERSION_PY = (
    "import importlib.metadata as m\n"
    "try:\n    print(m.version('sglang'))\n"
    "except m.PackageNotFoundError:\n    pass\n"
)


def _parse(lines: list[str] | None, parser: Callable[[list[str]], T]) -> T | None:
    """Parse a section; an absent, empty or unrecognised section is None (the last logged,
    as every fact does: ``gpuserve.facts.base.ParsedFact``)."""
    if not lines or not any(line.strip() for line in lines):
        return None
    try:
        return parser(lines)
    except ValueError as exc:
        logger.warning("host facts document: unrecognised %s output, treated as absent: %s",
                       parser.__name__, exc)
        return None


def document_from_sections(sections: dict[str, list[str]]) -> dict[str, Any]:
    """Build the host-facts document (docs/architecture.md) from the gathered sections."""
    gpus = _parse(sections.get("gpus"), nvidia_smi.parse_query_gpu) or []
    topo = _parse(sections.get("topo"), nvidia_smi.parse_topo_matrix)
    p2p_r = _parse(sections.get("p2p_r"), nvidia_smi.parse_p2p_matrix)
    p2p_w = _parse(sections.get("p2p_w"), nvidia_smi.parse_p2p_matrix)
    driver = driver_from_sections(sections)
    cmdline = _parse(sections.get("cmdline"), proc_cmdline.parse_cmdline)
    iommu_lines = sections.get("iommu")
    groups: list[iommu.IommuGroup] | None = None
    if iommu_lines and iommu_lines[0].strip() == IOMMU_MARKER:
        try:
            groups = iommu.parse_iommu_groups(iommu_lines[1:])
        except ValueError:
            groups = None
    modules = _parse(sections.get("modules"), proc_modules.parse_proc_modules)
    hostname = [line.strip() for line in sections.get("hostname", []) if line.strip()]
    sglang = [line.strip() for line in sections.get("sglang", []) if line.strip()]
    return {
        "hostname": hostname[0] if hostname else None,
        "virtualization": _parse(sections.get("virt"), systemd_detect_virt.parse_detect_virt),
        "gpus": gpus,
        "topology": {
            "links": topo.links if topo else None,
            "p2p_read": p2p_r.cells if p2p_r else None,
            "p2p_write": p2p_w.cells if p2p_w else None,
            "p2p": nvidia_smi.p2p_verdict(p2p_r, p2p_w),
        },
        "fabric": [{"bus_id": b["bus_id"], "state": b["state"], "status": b["status"]}
                   for b in _parse(sections.get("fabric"), nvidia_smi.parse_fabric_query)
                   or []] or None,
        "driver": {"version": driver["version"], "flavour": driver["flavour"]},
        "cuda": {"toolkit": _parse(sections.get("cuda"), cuda.parse_toolkit)},
        "kernel": {
            "cmdline": cmdline["raw"] if cmdline else None,
            "iommu": iommu.iommu_state(groups, cmdline["args"] if cmdline else None),
            "iommu_groups": len(groups) if groups is not None else None,
            "boot_loader": _parse(sections.get("boot"), bootloader.parse_boot_evidence),
            "secure_boot": _parse(sections.get("secure_boot"), mokutil.parse_sb_state),
            "nouveau_loaded": ("nouveau" in modules) if modules is not None else None,
        },
        "cpu_vendor": _parse(sections.get("cpu"), cpuinfo.parse_cpu_vendor),
        "sglang_version": sglang[0] if sglang else None,
        "measured": _measured(sections.get("measured")),
        "rdma": _rdma(sections.get("host_json"), sections.get("rdma_pairs")),
    }


def _rdma(lines: list[str] | None, pairs: list[str] | None = None) -> dict[str, Any] | None:
    """host.json's ``rdma`` block, with ``pairs`` from the pair measurement's file where
    this host was a client; None when not gathered, absent or unreadable (unknown: the
    RDMA rules stay silent)."""
    doc = _json_file(lines, HOST_JSON_PATH)
    rdma = doc.get("rdma") if isinstance(doc, dict) else None
    if not isinstance(rdma, dict):
        return None
    measured = _pairs(pairs)
    return rdma if measured is None else {**rdma, "pairs": measured}


def _pairs(lines: list[str] | None) -> list[dict[str, Any]] | None:
    """The pair measurement's entries (None: no file, unreadable or not ours)."""
    doc = _json_file(lines, PAIRS_PATH)
    found = doc.get("pairs") if isinstance(doc, dict) else None
    return [p for p in found if isinstance(p, dict)] if isinstance(found, list) else None


def _json_file(lines: list[str] | None, path: str) -> Any:
    """A host file's JSON (None: not gathered, absent, unreadable or not JSON, warned)."""
    if not lines or UNREADABLE in "\n".join(lines):
        return None
    try:
        return safeload.loads_json("\n".join(lines), path)
    except InputError as exc:
        logger.warning("host facts document: %s: %s, treated as unknown", path, exc)
        return None


def _measured(lines: list[str] | None) -> dict[str, Any] | None:
    """The ``measured`` section from ``/etc/gpuserve/measured.json``: ``None`` when not
    gathered, unreadable or not ours (unknown: no rule reads it), ``{"state": "none"}``
    when the host has no measurement."""
    if lines is None:
        return None
    text = "\n".join(lines)
    if UNREADABLE in text:
        logger.warning("host facts document: %s is not readable, treated as unknown",
                       MEASURED_JSON)
        return None
    try:
        doc = read_measured(text)
    except InputError as exc:  # not JSON, or not a gpuserve.measured/1 file
        logger.warning("host facts document: %s: %s, treated as unknown", MEASURED_JSON, exc)
        return None
    if doc is None:
        return {"state": "none"}
    return measured_section(doc, MEASURED_JSON)


def gather_script(sglang_python: str = "") -> StringCommand:
    """The shell script that prints every section (marker line, then the output)."""
    # each nvidia-smi run on its own and the rest in turn, side by side: nvidia-smi
    # starts slowly (NVML initialises every GPU unless persistence mode is on), and the
    # sections are found by their markers, so their order does not matter
    slow = [f"echo '{marker(name)}'; {{ {command}; }}" for name, command in _SECTIONS
            if name in _NVIDIA_SMI_SECTIONS]
    rest = " ".join(f"echo '{marker(name)}'; {{ {command}; }};" for name, command in _SECTIONS
                    if name not in _NVIDIA_SMI_SECTIONS)
    parts: list[Any] = [f"{{ {in_parallel([*slow, rest + ' true'], prefix=DOC_PREFIX)}\n}};"]
    if sglang_python:
        parts += [
            f"echo '{marker('sglang')}';",
            "if [ -x",
            QuoteString(sglang_python),
            "]; then",
            QuoteString(sglang_python),
            "-c",
            QuoteString(_SGLANG_VERSION_PY),
            "2>/dev/null; fi;",
        ]
    parts.append("true")
    return StringCommand(*parts)


class HostFactsDocument(FactBase[dict[str, Any]]):
    """The doctor's host-facts document (docs/architecture.md) in one round trip.

    ``sglang_python`` is the interpreter of the SGLang virtualenv (e.g.
    ``/opt/sglang/venv/bin/python``); without it ``sglang_version`` is null.
    """

    @staticmethod
    def default() -> dict[str, Any]:
        return document_from_sections({})

    def command(self, sglang_python: str = "") -> StringCommand:
        return gather_script(sglang_python)

    def process(self, output: list[str]) -> dict[str, Any]:
        # sections of a job cut short are absent (None), never a shorter answer
        inner = complete_jobs(output, prefix=DOC_PREFIX)
        rest = output[next((i for i, line in enumerate(output)
                            if line == marker("sglang")), len(output)):]
        return document_from_sections(split_sections([*inner, *rest]))


def host_facts_document(host: Any, sglang_python: str = "") -> dict[str, Any]:
    """Gather the host-facts document from a connected pyinfra ``host``.

    The result is checked with the doctor's own reader (gpuserve.host.hostfacts), so a shape
    drift between the two sides fails here, naming the field, not inside a rule.
    """
    document = host.get_fact(HostFactsDocument, sglang_python=sglang_python)
    HostFacts.from_dict(document, f"<facts of {host.name}>")
    return document
