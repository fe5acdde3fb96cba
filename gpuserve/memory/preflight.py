"""Memory preflight: does a profile fit the host's GPUs with the checkpoint actually there?

The serve deploy can scan the model directory on the host (checkpoint_scan.py) and gather
the GPUs (NvidiaGpus fact) before it starts SGLang; ``check_fit`` runs the planner on those
real figures instead of the model record, and refuses with the fraction that would fit,
rather than letting SGLang find out after minutes of weight loading.

``launch_settings`` is the one mapping from a profile (plus ``gpuserve plan``'s CLI
overrides) to the planner's Layout and launch knobs; ``gpuserve plan`` uses it too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuserve.errors import InputError
from gpuserve.host.gpus import get_gpu
from gpuserve.memory.calibration import calibrate_or_check
from gpuserve.memory.checkpoint import CheckpointScan, checkpoint_weights, unrecognised
from gpuserve.memory.draft import resolve_draft
from gpuserve.memory.measured import MeasuredStart
from gpuserve.memory.models import load_record
from gpuserve.memory.planner import GIB, FitVerdict, Layout, Plan, PlanRequest, predict

# Free memory lost before weights load when the GPU is not in gpus.yaml (CUDA context,
# NCCL, cuBLAS); the planner's own default.
DEFAULT_INIT_OVERHEAD_GIB = 2.0


@dataclass(frozen=True)
class LaunchSettings:
    """What the planner needs from a profile: the layout and the memory knobs."""

    layout: Layout
    knobs: dict[str, Any]  # predict() keyword arguments (mem_fraction_static, ...)


def _pick(override: Any, profile_value: Any) -> Any:
    return override if override is not None else profile_value


def launch_settings(profile: Any, overrides: Mapping[str, Any] | None = None) -> LaunchSettings:
    """Layout and knobs from a profile (or None) with overrides (``gpuserve plan`` flags by
    their argparse dest: tp, ep, attn_dp, moe_a2a_backend, mem_fraction_static, ...) on top."""
    o = dict(overrides or {})
    par = profile.parallel if profile else None
    mem = profile.memory if profile else None
    moe = profile.moe if profile else None
    spec = profile.speculative if profile else None
    algo = _pick(o.get("speculative"), spec.algorithm if spec else None)
    # A separate EAGLE draft model is one layer of target-shaped KV, not the MTP layers.
    draft_layers = 1 if (algo and spec and spec.draft_model) else None
    layout = Layout(
        tp=_pick(o.get("tp"), par.tp if par else None) or 1,
        ep=_pick(o.get("ep"), par.ep if par else None) or 1,
        attn_dp=_pick(o.get("attn_dp"), par.attention_dp if par else None) or 1,
        moe_a2a_backend=_pick(o.get("moe_a2a_backend"), moe.a2a_backend if moe else None)
        or "none",
        num_redundant_experts=_pick(
            o.get("num_redundant_experts"), moe.num_redundant_experts if moe else None
        )
        or 0,
        speculative=algo,
        draft_layers=draft_layers,
        # a PD role's profile (gpuserve/fleet/disaggregation.py) plans that role's memory
        disaggregation_mode=getattr(getattr(profile, "disaggregation", None), "mode", None)
        or "null",
        num_draft_tokens=spec.num_draft_tokens if spec else None,
    )
    knobs = {
        key: _pick(o.get(key), getattr(mem, key) if mem else None)
        for key in (
            "mem_fraction_static",
            "cuda_graph_max_bs",
            "chunked_prefill_size",
            "max_running_requests",
            "context_length",
        )
    }
    knobs["kv_cache_dtype"] = _pick(o.get("kv_cache_dtype"), mem.kv_cache_dtype if mem else None)
    knobs["kv_cache_dtype"] = knobs["kv_cache_dtype"] or "auto"
    knobs["dsa_backend"] = o.get("dsa_backend") or (
        profile.attention.dsa_decode_backend if profile else None
    )
    return LaunchSettings(layout, knobs)


@dataclass
class FitReport:
    """The preflight's answer for one profile on one host."""

    ok: bool
    verdict: FitVerdict
    lines: list[str]
    message: str = ""  # why it is refused and the change that would fit ("" when ok)
    notes: list[str] = field(default_factory=list)
    plan: Plan | None = None


def _gpu_facts(gpus: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """The smallest GPU (SGLang sizes every rank by the minimum) and notes on a mixed box."""
    smallest = min(gpus, key=lambda g: float(g.get("memory_total_mib") or 0))
    notes = []
    names = sorted({str(g.get("name")) for g in gpus})
    sizes = sorted({int(g.get("memory_total_mib") or 0) for g in gpus})
    if len(names) > 1 or len(sizes) > 1:
        notes.append(
            f"GPUs differ ({', '.join(names)}; memory.total {', '.join(map(str, sizes))} MiB): "
            f"planned for the smallest, {smallest.get('name')} with "
            f"{smallest.get('memory_total_mib')} MiB"
        )
    return dict(smallest), notes


def init_overhead(name: str) -> float:
    """The GPU catalog's CUDA-context overhead of ``name`` (GiB), or the default for a
    GPU the catalog does not list."""
    try:
        return get_gpu(name).init_overhead_gib
    except InputError:
        return DEFAULT_INIT_OVERHEAD_GIB


def sm_major(compute_cap: Any) -> int | None:
    """The SM major of nvidia-smi's ``compute_cap`` ("12.0" -> 12), None when unreadable."""
    try:
        return int(str(compute_cap).split(".")[0])
    except ValueError:
        return None


def check_fit(
    profile: Any,
    scan: CheckpointScan,
    gpus: Sequence[Mapping[str, Any]],
    version: str,
    draft_scan: CheckpointScan | None = None,
    measured: MeasuredStart | None = None,
) -> FitReport:
    """Plan ``profile`` with the checkpoint's own weights on the host's GPUs (NvidiaGpus
    dicts) under SGLang ``version``'s defaults; ``ok`` when SGLang would size a KV pool
    (or may: "risky" goes ahead, its reason in the notes). A separate speculative draft
    is charged from ``draft_scan`` (its checkpoint), else from the record
    ``speculative.draft_arch`` names. ``measured``, the host's last start of the same
    checkpoint and version, calibrates the plan (gpuserve.memory.calibration); without
    it the real starts the model record quotes are checked."""
    if not gpus:
        return FitReport(False, FitVerdict.NO_GPUS, [],
                         f"profile {profile.name}: the host shows no GPU")
    need = profile.gpus
    if need > len(gpus):
        return FitReport(
            False,
            FitVerdict.TOO_FEW_GPUS,
            [],
            f"profile {profile.name} needs {need} GPUs (tp {profile.parallel.tp} x dp "
            f"{profile.parallel.dp}), the host has {len(gpus)}",
        )
    gpu, notes = _gpu_facts(gpus)
    record = load_record(profile.model.arch) if profile.model.arch else None

    def plan_for(settings: LaunchSettings) -> Plan:
        return _predict(profile, settings, scan, gpu, len(gpus), version, record, draft_scan)

    settings = launch_settings(profile)
    plan, why = calibrate_or_check(
        plan_for(settings), record=record, measured=measured, checkpoint=profile.model.path,
        replan=lambda layout: plan_for(replace(settings, layout=layout)))
    if why:
        notes.append(f"the host's measured start does not calibrate this launch ({why})")
    notes += [line for line in plan.explanation if line.startswith("model record ")]
    unknown = unrecognised(scan, scan.arch(profile.model.arch or None))
    if unknown:
        notes.append(
            f"{len(unknown)} tensor patterns not recognised, counted as replicated: "
            + ", ".join(unknown[:5])
            + (" ..." if len(unknown) > 5 else "")
        )
    return _report(profile, plan, scan, len(gpus), str(gpu.get("name") or "GPU"), notes)


def _predict(profile: Any, settings: LaunchSettings, scan: CheckpointScan,
             gpu: Mapping[str, Any], count: int, version: str, record: Any,
             draft_scan: CheckpointScan | None) -> Plan:
    """The planner on ``settings`` with the checkpoint's weights on this host's GPU."""
    arch = scan.arch(profile.model.arch or None)
    parts = checkpoint_weights(scan, settings.layout, arch)
    spec = profile.speculative
    draft = resolve_draft(spec.algorithm, layout=settings.layout, draft_arch=spec.draft_arch,
                          scan=draft_scan) if settings.layout.speculative else None
    name = str(gpu.get("name") or "GPU")
    return predict(
        arch,
        PlanRequest(gpu_memory_mib=float(gpu["memory_total_mib"]),
        gpu_name=name,
        # a multi-node launch spreads tp x pp over every node of the group, each a host
        # like this one (the GPUs it needs here are checked above: profile.gpus)
        gpu_count=count * max(profile.parallel.nnodes, 1),
        sm_major=sm_major(gpu.get("compute_cap")),
        init_overhead_gib=init_overhead(name),
        layout=settings.layout,
        version=version,
        weight_parts=parts,
        weights_from=f"checkpoint {scan.directory}",
        record=record,
        draft=draft,
        **settings.knobs),
    )


def _report(profile: Any, plan: Plan, scan: CheckpointScan, count: int, name: str,
            notes: list[str]) -> FitReport:
    """The preflight's answer from a plan: lines, the refusal message, risky notes."""
    lines = [
        f"weights {plan.weights_gib:.2f} GiB/GPU from the checkpoint ({scan.directory}, "
        f"{scan.tensor_count:,} tensors, {scan.total_bytes / GIB:.1f} GiB in all)",
        f"predicted rest for KV {plan.rest_gib:.2f} GiB/GPU at mem_fraction_static "
        f"{plan.mem_fraction_static:.3f}",
        f"KV tokens {plan.kv_tokens:,} ({plan.kv_cell['bytes_per_token']:,} B/token)",
    ]
    lines += [line for line in plan.explanation if line.startswith("draft ")]
    cal = plan.calibrated
    if cal:
        lines += [line for line in cal["explanation"]]
    notes += [change for change in plan.changes if "draft does not fit" in change]
    ok = plan.verdict.starts or plan.verdict == FitVerdict.RISKY
    if plan.verdict == FitVerdict.RISKY:
        notes.append(f"profile {profile.name} is risky on {count}x {name}: "
                     + next((line for line in reversed(plan.explanation)
                             if line.startswith("risky")), "")
                     + (f"; {plan.changes[0]}" if plan.changes else ""))
    message = "" if ok else refusal(profile, plan, scan, f"{count}x {name}")
    return FitReport(ok, plan.verdict, lines, message, notes, plan)


def refusal(profile: Any, plan: Plan, scan: CheckpointScan, gpus: str) -> str:
    """A launch that cannot start, for a person: a first line with the profile, the
    field and its value, indented lines with the figures (each under ~200 characters),
    one minimum fraction (or that none fits) and one fix, last."""
    cal = plan.calibrated
    rest = cal["rest_gib"] if cal else plan.rest_gib
    mfs = cal["mem_fraction_static"] if cal else plan.mem_fraction_static
    after = cal["free_after_weights_gib"] if cal else plan.avail_after_weights_gib
    pre = cal["free_before_weights_gib"] if cal else plan.pre_load_free_gib
    if plan.problems:
        return f"profile {profile.name} cannot start on {gpus} ({plan.verdict}): " + \
            "\n".join(plan.problems[:3] + [f"fix: {c}" for c in plan.changes[:1]])
    lines = [f"profile {profile.name} does not fit on {gpus} ({plan.verdict}): "
             f"memory.mem_fraction_static {mfs:.3f} leaves {rest:.2f} GiB/GPU for the KV cache",
             f"weights {plan.weights_gib:.2f} GiB/GPU from the checkpoint ({scan.directory}); "
             f"free after weights {after:.2f}"
             + (f" +- {cal['uncertainty_gib']:.2f}" if cal else "") + f" of {pre:.2f} GiB/GPU"]
    if cal:
        lines += [f"calibrated by the host's measured start: {cal['measured_after_gib']:.2f} "
                  "GiB free after weights measured", f"start record: {cal['source']}"]
    minimum = cal["safe_mfs"] if cal else math.ceil(plan.min_viable_mfs * 1000) / 1000
    if minimum < 1:  # else the fix says that none fits, and what would
        lines.append(f"minimum viable mem_fraction_static {minimum:.3f}" + (
            f" (clears the {cal['uncertainty_gib']:.2f} GiB uncertainty)" if cal else ""))
    if plan.changes:
        lines.append(f"fix: {plan.changes[0]}")
    return "\n".join(lines)
