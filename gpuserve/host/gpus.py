"""GPU specs for the planner, read from ``gpuserve/data/gpus.yaml``.

``--gpus 8xRTX-PRO-6000`` names a count and a spec. The spec carries the nvidia-smi
``memory.total`` figure because that, not the marketing size, is what SGLang's default
``mem_fraction_static`` is computed from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from gpuserve import safeload
from gpuserve.errors import InputError
from gpuserve.paths import DATA_DIR

GPUS_FILE = DATA_DIR / "gpus.yaml"
_SPEC_RE = re.compile(r"^\s*(?:(\d+)\s*[xX]\s*)?(\S+)\s*$")


@dataclass(frozen=True)
class GpuSpec:
    key: str
    name: str
    memory_total_mib: int
    compute_capability: str
    init_overhead_gib: float
    sources: tuple[str, ...] = ()
    datasheet_gb: float = 0.0  # the vendor's capacity in decimal GB (not nvidia-smi's MiB)
    datasheet: str = ""  # the vendor page that states it

    @property
    def memory_total_gib(self) -> float:
        return self.memory_total_mib / 1024

    @property
    def sm_major(self) -> int:
        return int(self.compute_capability.split(".")[0])


def norm_name(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


@cache
def _catalog() -> dict[str, GpuSpec]:
    data = safeload.load_yaml_file(GPUS_FILE)
    out: dict[str, GpuSpec] = {}
    for key, rec in data["gpus"].items():
        spec = GpuSpec(
            key=key,
            name=rec["name"],
            memory_total_mib=int(rec["memory_total_mib"]),
            compute_capability=str(rec["compute_capability"]),
            init_overhead_gib=float(rec["init_overhead_gib"]),
            sources=tuple(rec.get("sources", ())),
            datasheet_gb=float(rec.get("datasheet_gb") or 0),
            datasheet=str(rec.get("datasheet") or ""),
        )
        if not spec.datasheet.startswith("https://") or spec.datasheet_gb <= 0:
            raise InputError(GPUS_FILE, f"gpus.{key}.datasheet",
                             "every GPU needs datasheet_gb and the vendor's https:// page")
        for alias in [key, rec["name"], *rec.get("aliases", [])]:
            out[norm_name(alias)] = spec
    return out


def known_gpus() -> list[str]:
    return sorted({spec.key for spec in _catalog().values()})


def get_gpu(name: str) -> GpuSpec:
    spec = _catalog().get(norm_name(name))
    if spec is None:
        raise InputError("--gpus", "gpu", f"unknown GPU {name!r}; known: {', '.join(known_gpus())}")
    return spec


#: GPUs of one node; the largest NVLink domains (GB200 NVL72) are well below it.
MAX_GPUS = 1024


def parse_gpus(text: str) -> tuple[int, GpuSpec]:
    """Parse ``8xRTX-PRO-6000`` (count defaults to 1) into (count, spec)."""
    match = _SPEC_RE.match(text or "")
    if not match:
        raise InputError("--gpus", "gpus", f"expected COUNTxGPU such as 8xH200, got {text!r}")
    digits = match.group(1) or "1"
    count = int(digits) if len(digits) <= 6 else MAX_GPUS + 1  # no 4300-digit int parse
    if not 1 <= count <= MAX_GPUS:
        # the planner sizes one node's GPUs (tp x dp ranks); 10**20 GPUs planned silently
        raise InputError("--gpus", "gpus", f"GPU count must be 1 to {MAX_GPUS}, got "
                         f"{digits[:12]}{'...' if len(digits) > 12 else ''}")
    return count, get_gpu(match.group(2))
