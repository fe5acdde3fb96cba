"""Judge a venv's verification report (gpuserve/data/scripts/sglang_verify.py) against its lock.

A venv is put behind the unit only when what imports inside it is what the lock says:
the same sglang and torch, torch built for the lock's CUDA, and, on a host with GPUs,
CUDA usable and every GPU's compute capability among the architectures the lock's
kernels carry code for (the kernel wheels ship SASS without PTX, sglang-install.md §1,
so a capability outside the list has no kernel at all).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from gpuserve.launch.locks import Lock


@dataclass(frozen=True)
class Verification:
    ok: bool
    summary: str  # one line for the deploy's output
    problems: tuple[str, ...]


def arch_of(capability: str) -> str:
    """``"12.0"`` -> ``"sm_120"``, ``"9.0"`` -> ``"sm_90"`` (nvcc's spelling)."""
    major, _, minor = capability.partition(".")
    return f"sm_{int(major)}{int(minor or 0)}"


def runs_on(archs: tuple[str, ...] | list[str], capability: str) -> bool:
    """Whether SASS built for one of ``archs`` runs on a GPU of ``capability``.

    A cubin for sm_XY runs on any GPU of the same major X with minor >= Y (CUDA C++
    Programming Guide, "Binary Compatibility"), so sm_80 code serves an sm_86 GPU; an
    arch-specific target (sm_90a) runs only on exactly that GPU. No PTX is assumed (the
    kernel wheels ship none), so nothing carries over to a newer major."""
    major, _, minor = capability.partition(".")
    want_major, want_minor = int(major), int(minor or 0)
    for arch in archs:
        digits = arch.removeprefix("sm_")
        specific = digits.endswith(("a", "f"))
        digits = digits.rstrip("af")
        if not digits.isdigit() or len(digits) < 2:
            continue
        a_major, a_minor = int(digits[:-1]), int(digits[-1])
        if a_major == want_major and (a_minor == want_minor or
                                      (not specific and a_minor < want_minor)):
            return True
    return False


def _public(version: object) -> str | None:
    return None if version is None else str(version).split("+", 1)[0]


def _report(lines: list[str] | None) -> dict | None:
    for line in reversed(lines or []):
        line = line.strip()
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                return None
            return data if isinstance(data, dict) else None
    return None


#: CUDA error 802 (cudaErrorSystemNotReady): on an NVSwitch host, the fabric is not
#: registered (doctor rule fabric-not-ready; docs/nvswitch.md)
FABRIC_HINT = ("CUDA error 802 means the GPUs' NVLink fabric is not registered: on an "
               "NVSwitch host (HGX/DGX) NVIDIA Fabric Manager must run at exactly the "
               "driver's version; run deploy/host.py (it installs, starts and waits for it), "
               "then `nvidia-smi -q | grep -A 3 Fabric` shows State Completed "
               "(gpuserve doctor: fabric-not-ready; docs/nvswitch.md)")


def _not_ready(warning: object) -> bool:
    text = str(warning or "")
    return "802" in text or "system not yet initialized" in text


def judge(lines: list[str] | None, lock: Lock, expect_gpus: int) -> Verification:
    """``expect_gpus``: GPUs the host's nvidia-smi lists (0: no GPU check possible)."""
    data = _report(lines)
    if data is None:
        shown = " | ".join((lines or [])[-3:]) or "no output"
        return Verification(False, "verification printed no report", (f"output: {shown}",))
    problems: list[str] = []
    if data.get("error"):
        problems.append(f"import failed: {data['error']}")
    # The distributions' own versions must be the lock's exactly; torch.__version__ adds
    # the build's local label on PyPI's wheels ("2.14.1+cu130" from torch 2.14.1), so it
    # is compared without the label.
    for key, have, want in (("sglang", data.get("sglang"), lock.sglang),
                            ("torch", data.get("torch_dist"), lock.torch),
                            ("torch.__version__", _public(data.get("torch")), _public(lock.torch)),
                            ("torch.version.cuda", data.get("torch_cuda"), lock.torch_cuda)):
        if have is not None and str(have) != want:
            problems.append(f"{key} is {have}, the lock says {want}")
        elif have is None and not data.get("error"):
            problems.append(f"{key} not reported")
    devices = data.get("devices") or []
    if expect_gpus:
        if not data.get("cuda_available") and _not_ready(data.get("cuda_warning")):
            problems.append(f"torch.cuda.is_available() is False: {data['cuda_warning']}. "
                            f"{FABRIC_HINT}")
        elif not data.get("cuda_available"):
            problems.append(f"torch.cuda.is_available() is False on a host with {expect_gpus} "
                            f"GPU(s): the driver cannot run CUDA {lock.torch_cuda} "
                            f"(needs >= {lock.driver_min}) or the GPUs are not visible to "
                            "the service user")
        elif len(devices) != expect_gpus:
            problems.append(f"torch sees {len(devices)} GPU(s), nvidia-smi lists {expect_gpus}")
        for dev in devices:
            capability = str(dev.get("capability", "0.0"))
            arch = arch_of(capability)
            if lock.cuda_archs and not runs_on(lock.cuda_archs, capability):
                problems.append(f"{dev.get('name')} is {arch}, the lock's kernels are built "
                                f"for {', '.join(lock.cuda_archs)}")
    archs = sorted({arch_of(str(d.get("capability", "0.0"))) for d in devices})
    summary = (f"sglang {data.get('sglang')}, torch {data.get('torch')} "
               f"(CUDA {data.get('torch_cuda')}), "
               + (f"{len(devices)} GPU(s) {'/'.join(archs)}" if devices else "no GPU in use"))
    return Verification(not problems, summary, tuple(problems))
