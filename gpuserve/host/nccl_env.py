"""NCCL environment from the host's facts: what to set, and why, line by line.

The decision is the P2P verdict: NCCL itself checks NVML's P2P status and falls back to
the SHM transport when P2P is disabled (NVIDIA/nccl ``src/transport/p2p.cc``;
sjeaugey in NVIDIA/nccl#631: "no problem, just reduced performance"), but RTX PRO 6000
hosts have hung in the P2P transport even where ``topo -p2p`` read OK
(local-inference-lab/rtx6kpro#15, NVIDIA/nccl#1999). So:

- P2P OK on bare metal: leave NCCL's defaults (no overrides).
- a VM, or P2P not OK (CNS/GNS/...): ``NCCL_P2P_DISABLE=1`` and SGLang must run with
  ``--disable-custom-all-reduce`` (its custom all-reduce needs CUDA IPC / P2P;
  sgl-project/sglang ``server_args.py``).

Every value can be overridden from host data; an override of ``""`` removes a key.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from gpuserve import safeload
from gpuserve.env_names import reserved_env
from gpuserve.errors import InputError
from gpuserve.host.container import CONTAINER_NAMES

NCCL_ENV_PATH = "/etc/gpuserve/nccl.env"
HOST_JSON_PATH = "/etc/gpuserve/host.json"

_NAME = re.compile(r"^(NCCL|CUDA|SGLANG|TORCH)_[A-Z0-9_]+$")


def p2p_verdict(matrix: Any) -> str | None:
    """``"ok"`` / ``"none"`` / ``"partial"`` from a ``topo -p2p`` matrix or a verdict string.

    The matrix is a list of rows of cells (``X``, ``OK``, ``CNS``, ...) as parsed from
    ``nvidia-smi topo -p2p r``; the diagonal ``X`` is ignored. ``None`` when unknown
    (no nvidia-smi yet, or a single GPU).
    """
    if matrix is None:
        return None
    if isinstance(matrix, str):
        return matrix if matrix in ("ok", "none", "partial") else None
    if isinstance(matrix, dict):
        return p2p_verdict(matrix.get("cells") or matrix.get("p2p") or matrix.get("matrix"))
    if hasattr(matrix, "cells"):  # gpuserve.parsers.nvidia_smi.P2PMatrix
        return p2p_verdict(matrix.cells)
    cells = [
        str(cell).strip()
        for i, row in enumerate(matrix)
        for j, cell in enumerate(row)
        if i != j and str(cell).strip() != "X"
    ]
    if not cells:
        return None
    ok = sum(1 for c in cells if c == "OK")
    if ok == len(cells):
        return "ok"
    return "none" if ok == 0 else "partial"


def combined_verdict(*matrices: Any) -> str | None:
    """One verdict over several ``topo -p2p`` matrices (read and write): a pair counts as
    OK only when every matrix says OK (gpuserve.parsers.nvidia_smi.p2p_verdict).

    Accepts the NvidiaP2P fact's ``{"gpus", "cells"}`` dicts or parsed P2PMatrix objects;
    absent matrices (no nvidia-smi) are skipped.
    """
    from gpuserve.parsers import nvidia_smi

    parsed = []
    for m in matrices:
        if m is None:
            continue
        if isinstance(m, dict):
            m = nvidia_smi.P2PMatrix(gpus=list(m["gpus"]), cells=[list(r) for r in m["cells"]])
        parsed.append(m)
    return nvidia_smi.p2p_verdict(*parsed)


def is_vm(virtualization: str | None) -> bool:
    """A VM guest: virtualized, and not a container (which shares its host's kernel and
    the host's P2P: gpuserve/host/container.py)."""
    return (bool(virtualization) and virtualization not in ("none", "")
            and virtualization not in CONTAINER_NAMES)


@dataclass
class NcclPlan:
    """The NCCL env with a reason per key, and what SGLang must be told."""

    env: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    disable_custom_all_reduce: bool = False
    p2p: str | None = None
    virtualization: str | None = None
    summary: str = ""
    measured: dict[str, Any] | None = None  # the measuring stage's choice, when it ran
    rdma: dict[str, Any] | None = None  # roles/rdma's record (gpuserve.host.rdma.record)


def validate_overrides(overrides: Any) -> dict[str, str]:
    """Host-data ``nccl_env`` must map env-var names to strings/numbers; raises ValueError."""
    if overrides is None:
        return {}
    if not isinstance(overrides, dict):
        raise ValueError("must be a mapping of NCCL_* variable names to values")
    clean: dict[str, str] = {}
    for key, value in overrides.items():
        if not isinstance(key, str) or not _NAME.match(key):
            raise ValueError(f"{key!r} is not an NCCL_/CUDA_/SGLANG_/TORCH_ variable name")
        reserved = reserved_env(key)
        if reserved:  # CUDA_HOME: the same rule as the server's own EnvironmentFile
            raise ValueError(f"{key} {reserved}")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ValueError(f"{key}: value must be a string or number, got {value!r}")
        text = str(value)
        if "\n" in text or '"' in text:
            raise ValueError(f"{key}: value must be one line without double quotes")
        clean[key] = text
    return clean


def plan_nccl(
    virtualization: str | None,
    p2p: Any,
    overrides: dict[str, str] | None = None,
    gpu_count: int | None = None,
    measured: dict[str, Any] | None = None,
) -> NcclPlan:
    """Decide the NCCL env from the virtualization fact and the P2P verdict, or, once the
    measuring stage (roles/gpu_gates) has run, from its choice (``measured``: the
    ``choice`` of /etc/gpuserve/measured.json, a ``gates.NcclChoice`` as a dict): what
    the box did outranks what the driver says. Host-data overrides still come last."""
    verdict = p2p_verdict(p2p)
    plan = NcclPlan(p2p=verdict, virtualization=virtualization)
    vm = is_vm(virtualization)
    stale = measured is not None and measured_is_stale(measured, verdict)
    if stale:
        measured = None  # the host changed since (another box, ACS, a VM): the verdict rules
    if measured is not None:
        plan.measured = measured
        plan.env = {str(k): str(v) for k, v in (measured.get("env") or {}).items()}
        reason = str(measured.get("reason", ""))
        plan.reasons = {k: f"chosen from measurement (roles/gpu_gates): {reason}"
                        for k in plan.env}
        plan.disable_custom_all_reduce = bool(measured.get("disable_custom_all_reduce"))
        plan.summary = f"measured: {reason}"
        if plan.disable_custom_all_reduce:
            plan.summary += "; SGLang needs --disable-custom-all-reduce"
    elif vm or verdict in ("none", "partial"):
        why = []
        if vm:
            why.append(f"running in a {virtualization} guest (the emulated host bridge is "
                       "not on the driver's P2P allowlist)")
        if verdict in ("none", "partial"):
            why.append(f"nvidia-smi topo -p2p r/w verdict is '{verdict}'")
        reason = "; ".join(why)
        plan.env["NCCL_P2P_DISABLE"] = "1"
        plan.reasons["NCCL_P2P_DISABLE"] = (
            f"{reason}: use the SHM transport instead of P2P (NCCL falls back to SHM; "
            "RTX PRO 6000 P2P hangs: rtx6kpro#15, nccl#1999)"
        )
        plan.disable_custom_all_reduce = True
        plan.summary = f"P2P off ({reason}); SGLang needs --disable-custom-all-reduce"
    elif verdict == "ok":
        plan.summary = "P2P OK on bare metal: NCCL defaults, P2P left on"
    else:
        plan.summary = ("P2P verdict unknown (nvidia-smi not usable yet, or one GPU): NCCL "
                        "defaults; re-run the deploy after the driver is loaded")
    if stale:
        plan.summary += (" (the last measurement was taken under another driver P2P verdict: "
                         "run deploy/host.py to measure again)")
    if gpu_count is not None and gpu_count <= 1:
        plan.summary += " (single GPU: no collectives cross GPUs)"
    for key, value in (overrides or {}).items():
        if value == "":
            plan.env.pop(key, None)
            plan.reasons.pop(key, None)
            if key == "NCCL_P2P_DISABLE":
                plan.disable_custom_all_reduce = False
            continue
        plan.env[key] = value
        plan.reasons[key] = "set in host data (nccl_env)"
        if key == "NCCL_P2P_DISABLE":
            plan.disable_custom_all_reduce = value not in ("0", "")
    return plan


def measured_is_stale(measured: dict[str, Any], verdict: str | None) -> bool:
    """A measured choice holds only under the driver P2P verdict it was measured with
    (``numbers.driver_p2p``): P2P on is only ever chosen where the driver reported it,
    so a verdict that changed since (another box, ACS or IOMMU changes, a VM) makes the
    choice stale until the measuring stage runs again."""
    numbers = measured.get("numbers") if isinstance(measured, dict) else None
    return not isinstance(numbers, dict) or numbers.get("driver_p2p") != verdict


def render_env_file(plan: NcclPlan) -> str:
    """The ``/etc/gpuserve/nccl.env`` text: systemd EnvironmentFile syntax, each key commented."""
    lines = [
        "# Managed by gpuserve (roles/nccl); edit host data nccl_env instead of this file.",
        f"# Virtualization: {plan.virtualization or 'unknown'}; "
        f"P2P verdict (nvidia-smi topo -p2p r/w): {plan.p2p or 'unknown'}",
        f"# Decision: {plan.summary}",
    ]
    if not plan.env:
        lines.append("# No overrides: NCCL chooses its transports itself.")
    for key in sorted(plan.env):
        lines.append(f"# {key}: {plan.reasons.get(key, '')}")
        lines.append(f"{key}={plan.env[key]}")
    return "\n".join(lines) + "\n"


def parse_env_file(text: str) -> dict[str, str]:
    """Keys of an env file written by :func:`render_env_file` (comments ignored)."""
    env: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        env[key.strip()] = value.strip().strip('"')
    return env


def host_json(plan: NcclPlan) -> str:
    """``/etc/gpuserve/host.json``: what the serve deploy must know about communication."""
    doc = {
        "nccl_env_file": NCCL_ENV_PATH,
        "p2p": plan.p2p,
        "virtualization": plan.virtualization,
        "disable_custom_all_reduce": plan.disable_custom_all_reduce,
        "nccl_env": dict(sorted(plan.env.items())),
        "reason": plan.summary,
    }
    if plan.measured is not None:  # beside the driver's verdict, not instead of it
        doc["measured_nccl"] = plan.measured
    if plan.rdma is not None:  # devices the PD serve path and the doctor read
        doc["rdma"] = plan.rdma
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def sglang_flags_for_host(
    host_json_lines: list[str] | None, source: str = HOST_JSON_PATH
) -> list[str]:
    """SGLang flags the host's measured communication requires, from ``host.json``.

    The host deploy records ``disable_custom_all_reduce`` when GPUs lack P2P (a VM, or
    CNS/GNS in ``topo -p2p``): custom all-reduce needs CUDA IPC peer access
    (sglang issue #4814, "peer access is not supported"). A host not provisioned by
    gpuserve has no record and gets no extra flag. A record that is not valid JSON is
    an error, since silently ignoring it could start SGLang with a known-bad setting.
    """
    if not host_json_lines:
        return []
    # Bounded (size, depth, finite numbers) like every document read from a host.
    doc = safeload.loads_json("\n".join(host_json_lines), source, safeload.CONFIG)
    if not isinstance(doc, dict):
        raise InputError(source, None, "must be a JSON object")
    flag = doc.get("disable_custom_all_reduce", False)
    if not isinstance(flag, bool):
        raise InputError(source, "disable_custom_all_reduce", "must be true or false")
    return ["--disable-custom-all-reduce"] if flag else []
