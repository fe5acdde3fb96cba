"""Plan a launch from what a real start measured: one calibration for the tuner, the
serve preflight, ``gpuserve check``, ``--dry --diff``, the doctor and ``gpuserve plan``.

Why: the planner sees the weights, not the load-time overhead a box adds to them (CUDA
context beyond the init overhead, NCCL and custom all-reduce buffers, quantization
workspaces, which export of a model the box holds). The free memory SGLang measured
after loading the weights of one launch carries all of that; a new launch of the same
checkpoint and version is that figure plus what the planner says changes between the
two launches (EP's replicated shared experts and a2a buffers, a draft), with an
uncertainty that grows with what differs.

Without a host's own start, the measurements a model record quotes (``measured:``) are
checked instead: where they disagree about a launch, the verdict is "risky" with every
figure and its source, not "fits".

How: docs/planner.md, "Calibrated by the host".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from gpuserve.errors import InputError
from gpuserve.memory.measured import MeasuredStart, RecordMeasurement
from gpuserve.memory.planner import GIB, FitVerdict, Layout, Plan, cannot_fit_change

#: how far a calibrated rest may still be off: an EP8 launch calibrated to +0.42 GiB of
#: room had -0.89 (1.31 GiB), rounded up
CALIBRATION_ERROR_GIB = 1.5
#: a separate draft that neither a record nor a scan describes: its weights stand in as
#: SGLang's own old reserve for a draft (0.5.10.post1 server_args.py, "eagle draft models
#: and cuda graphs" 4 GiB, "standalone draft model and cuda graphs" 6 GiB;
#: gpuserve/memory/memory_defaults.py). A described draft is in the plan instead.
DRAFT_GIB = {"STANDALONE": 6.0}
DRAFT_DEFAULT_GIB = 4.0
#: what a plan from a record or safetensors headers cannot see
UNSEEN = ("load-time overhead this plan cannot see comes off the free memory after "
          "weights: CUDA context and cuBLAS workspaces beyond the init overhead, NCCL and "
          "custom all-reduce buffers, quantization workspaces, which export of the model "
          "the box holds; a host's measured start (gpuserve plan --calibrate LOG) carries it")


def uncertainty(algorithm: str | None, draft: dict | None = None) -> float:
    """GiB by which a calibrated rest may be wrong for a launch drafting with
    ``algorithm``: the calibration's error, plus what is still unknown of a draft:
    nothing for the target's MTP layers or a scanned draft, the config estimate's error
    for a draft record, SGLang's old flat reserve for a separate draft nothing describes
    (``draft``: the plan's figures, Plan.draft)."""
    if algorithm in (None, "NGRAM"):
        return CALIBRATION_ERROR_GIB
    known = draft.get("weights_error_gib") if draft else None
    if known is None:
        known = DRAFT_GIB.get(algorithm, DRAFT_DEFAULT_GIB)
    return CALIBRATION_ERROR_GIB + known


@dataclass
class CalibratedFit:
    """A launch planned from a measured start: the measured free memory after weights
    plus the planner's delta between the two launches, and the verdict on the rest."""

    verdict: FitVerdict
    free_before_weights_gib: float
    free_after_weights_gib: float  # calibrated, for the new launch
    rest_gib: float  # the KV budget; its margin above SGLang's refusal
    uncertainty_gib: float
    mem_fraction_static: float
    measured_after_gib: float | None  # what the measured launch had free after weights
    planned_delta_gib: float | None  # planner(new) - planner(measured launch)
    kv_tokens: int
    min_viable_mfs: float  # the fraction where the rest reaches 0
    safe_mfs: float  # the fraction where the rest clears the uncertainty
    source: str
    offset_gib: float = 0.0  # measured - planned free memory after weights
    explanation: list[str] = field(default_factory=list)

    @property
    def margin_gib(self) -> float:
        return self.rest_gib

    @property
    def ok(self) -> bool:
        """Whether the launch may go ahead (a risky one goes ahead with a warning)."""
        return self.verdict.starts or self.verdict == FitVerdict.RISKY

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["verdict"] = str(self.verdict)
        d["margin_gib"] = self.margin_gib
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in d.items()}


def calibrated_fit(new: Plan, measured_plan: Plan, measured: MeasuredStart, *,
                   uncertainty_gib: float | None = None) -> CalibratedFit:
    """Plan ``new`` from ``measured`` (a start of the same checkpoint and version on
    this kind of box); ``measured_plan`` is the planner's plan of the measured launch on
    the same inputs. ``uncertainty_gib`` defaults to the calibration's error plus the
    draft's unknowns when the two launches draft otherwise."""
    if measured.free_after_weights_gib is None:
        raise InputError(measured.source, "free_after_weights_gib", "nothing measured")
    total = _total_gib(new)
    pre = measured.free_before_weights_gib or new.pre_load_free_gib
    if total and pre > total + 0.01:
        raise InputError(measured.source, "free_before_weights_gib",
                         f"{pre:.2f} GiB free before weights is more than this launch's GPU "
                         f"holds ({total:.2f} GiB): measured on another GPU")
    if uncertainty_gib is None:
        same_draft = new.layout.get("speculative") == measured_plan.layout.get("speculative")
        # a draft one launch has and the other lacks: its unknowns, on whichever side
        uncertainty_gib = CALIBRATION_ERROR_GIB if same_draft else max(
            uncertainty(new.layout.get("speculative"), new.draft),
            uncertainty(measured_plan.layout.get("speculative"), measured_plan.draft))
    offset = measured.free_after_weights_gib - measured_plan.avail_after_weights_gib
    fit = offset_fit(new, offset, uncertainty_gib=uncertainty_gib, pre_gib=pre,
                     source=measured.source)
    fit.measured_after_gib = measured.free_after_weights_gib
    fit.planned_delta_gib = new.avail_after_weights_gib - measured_plan.avail_after_weights_gib
    fit.explanation = _lines(fit, new, measured_plan, measured)
    return fit


def offset_fit(new: Plan, offset_gib: float, *, uncertainty_gib: float,
               pre_gib: float | None = None, source: str = "") -> CalibratedFit:
    """``new`` with ``offset_gib`` (measured minus planned free memory after weights of
    a measured launch) added to its free memory after weights, the rest taken at its
    fraction of ``pre_gib`` (default: the plan's free memory before weights). The
    tuner calibrates every candidate with its incumbent's offset this way."""
    pre = pre_gib or new.pre_load_free_gib
    after = new.avail_after_weights_gib + offset_gib
    mfs = new.mem_fraction_static
    rest = after - pre * (1 - mfs)
    cell = int(new.kv_cell.get("bytes_per_token") or 0)
    tokens = max(int(rest * GIB), 0) // cell if cell else 0
    need, safe = 1 - after / pre, 1 - (after - uncertainty_gib) / pre
    return CalibratedFit(_verdict(rest, uncertainty_gib, tokens, new.context_length), pre,
                         after, rest, uncertainty_gib, mfs, None, None, tokens,
                         math.ceil(need * 1000) / 1000, math.ceil(safe * 1000) / 1000,
                         source, offset_gib=offset_gib)


def _verdict(rest: float, error: float, tokens: int, ctx: int | None) -> FitVerdict:
    if rest <= 0:
        return FitVerdict.REFUSED
    if tokens <= 0:
        return FitVerdict.NO_KV
    if rest < error:
        return FitVerdict.RISKY
    return FitVerdict.TIGHT if ctx and tokens < ctx else FitVerdict.FITS


def _total_gib(plan: Plan) -> float | None:
    mib = plan.defaults.get("gpu_memory_mib") if isinstance(plan.defaults, dict) else None
    return float(mib) / 1024 if isinstance(mib, int | float) else None


def _lines(fit: CalibratedFit, new: Plan, mp: Plan, measured: MeasuredStart) -> list[str]:
    """The calibration step by step, naming every measured figure."""
    pre, after, unc = fit.free_before_weights_gib, fit.free_after_weights_gib, fit.uncertainty_gib
    ranks = f"smallest of {len(measured.ranks)} ranks; " if len(measured.ranks) > 1 else ""
    lines = [
        f"measured start ({measured.source}): free before weights {pre:.2f} GiB, free after "
        f"weights {fit.measured_after_gib:.2f} GiB/GPU ({ranks}{measured.launch_text()})",
        f"planner: free after weights {mp.avail_after_weights_gib:.2f} GiB for the measured "
        f"launch, {new.avail_after_weights_gib:.2f} for this one: {fit.planned_delta_gib:+.2f} "
        f"GiB ({delta_parts(new, mp)})",
        f"calibrated free after weights {fit.measured_after_gib:.2f} "
        f"{fit.planned_delta_gib:+.2f} = {after:.2f} +- {unc:.2f} GiB",
        f"calibrated rest = {after:.2f} - {pre:.2f} x (1 - {fit.mem_fraction_static:.3f}) = "
        f"{fit.rest_gib:+.2f} GiB for the KV cache (margin {fit.rest_gib:+.2f} +- {unc:.2f} GiB)",
    ]
    if measured.graph_gib:
        bs = measured.launch.get("cuda_graph_max_bs")
        lines.append(
            f"the measured start's CUDA graphs took {measured.graph_gib:.2f} GiB"
            + (f" (decode graphs to bs {bs})" if bs else "") + f"; this launch leaves "
            f"{pre * (1 - fit.mem_fraction_static):.2f} GiB outside the static pool for its "
            f"graphs and activations (decode graphs to bs {new.defaults.get('decode_max_bs')})")
    if not measured.sglang_version:
        lines.append(f"the start's SGLang version is not in its record: taken to be this "
                     f"launch's ({new.version})")
    if not measured.launch:
        lines.append("the start's launch settings are not in its log (no server_args line): "
                     "taken to be this launch's layout")
    if fit.verdict in (FitVerdict.REFUSED, FitVerdict.NO_KV):
        lines.append(
            "SGLang would stop before serving (Loaded weights leave no GPU memory for the KV "
            "cache / Not enough memory); "
            + (f"minimum viable mem_fraction_static {fit.safe_mfs:.3f} (clears the "
               f"{unc:.2f} GiB uncertainty)" if fit.safe_mfs < 1 else
               f"no mem_fraction_static fits: {after:.2f} +- {unc:.2f} GiB free after weights "
               f"of {pre:.2f}"))
    elif fit.verdict == FitVerdict.RISKY:
        lines.append(
            f"risky: the margin is inside the uncertainty; it may start with about "
            f"{fit.kv_tokens:,} KV tokens or stop with 'Not enough memory'; mem_fraction_static "
            f"{fit.safe_mfs:.3f} clears the uncertainty")
    else:
        lines.append(f"calibrated KV tokens about {fit.kv_tokens:,}")
    return lines


def delta_parts(new: Plan, mp: Plan) -> str:
    """What the planner says changes per GPU between two launches: weight parts and the
    a2a buffers (``same layout`` when nothing does)."""
    old = {w["part"]: w["gib"] for w in mp.weights}
    cur = {w["part"]: w["gib"] for w in new.weights}
    diffs = [(name, cur.get(name, 0.0) - old.get(name, 0.0)) for name in {**old, **cur}]
    diffs.append(("a2a buffers", new.a2a_buffer_gib - mp.a2a_buffer_gib))
    words = [f"{name} {d:+.2f}" for name, d in diffs if abs(d) >= 0.005]
    return "per GPU: " + ", ".join(words) if words else "same layout"


# ------------------------------------------------------------- model records' measurements


@dataclass
class RecordEstimate:
    """One record measurement carried to a planned launch (GiB)."""

    measurement: RecordMeasurement
    free_before_weights_gib: float
    free_after_weights_gib: float
    rest_gib: float

    def to_dict(self) -> dict[str, Any]:
        return {"measurement": self.measurement.to_dict(),
                "free_before_weights_gib": round(self.free_before_weights_gib, 3),
                "free_after_weights_gib": round(self.free_after_weights_gib, 3),
                "rest_gib": round(self.rest_gib, 3)}


def matching(measurements: Sequence[RecordMeasurement], gpu_name: str,
             gpu_memory_mib: float) -> list[RecordMeasurement]:
    """The measurements made on this GPU: by name when the plan has one (a gpus.yaml key
    or nvidia-smi name), else by memory.total."""
    from gpuserve.host.gpus import get_gpu

    out = []
    for m in measurements:
        try:
            spec = get_gpu(m.gpu)
        except InputError:
            continue
        if gpu_name:
            try:
                if get_gpu(gpu_name).key == spec.key:
                    out.append(m)
            except InputError:
                continue
        elif int(spec.memory_total_mib) == int(gpu_memory_mib):
            out.append(m)
    return out


def record_estimates(plan: Plan, measurements: Sequence[RecordMeasurement],
                     replan: Callable[[Layout], Plan]) -> list[RecordEstimate]:
    """Each measurement carried to ``plan``'s launch: its free memory after weights
    plus the planner's delta from its layout (``replan``: the planner on the measured
    layout with the same inputs), the rest at ``plan``'s fraction."""
    out = []
    for m in measurements:
        layout = replace(Layout(**{k: v for k, v in plan.layout.items()
                                   if k in Layout.__dataclass_fields__}),
                         tp=m.tp, ep=m.ep, attn_dp=1, moe_a2a_backend="none",
                         num_redundant_experts=0, speculative=None, draft_layers=None)
        there = replan(layout)
        delta = plan.avail_after_weights_gib - there.avail_after_weights_gib
        after = m.free_after_weights_gib + delta
        pre = m.free_before_weights_gib or plan.pre_load_free_gib
        out.append(RecordEstimate(m, pre, after, after - pre * (1 - plan.mem_fraction_static)))
    return out


def judge_record(plan: Plan, estimates: list[RecordEstimate]) -> list[str]:
    """Mark ``plan`` risky where a measured start says its rest lies inside the
    calibration's error although the planner says it starts; the lines name every
    measurement, its source and what it says of this launch. Always names what the
    plan cannot see."""
    lines = [UNSEEN]
    for e in estimates:
        m = e.measurement
        lines.append(
            f"measured on {m.gpu}: {m.free_after_weights_gib:.2f} GiB free after TP{m.tp}"
            + (f"/EP{m.ep}" if m.ep > 1 else "") + " weights"
            + (f" ({m.checkpoint})" if m.checkpoint else "")
            + f" [{m.source}]: this launch {e.free_after_weights_gib:.2f} GiB free after "
            f"weights, rest {e.rest_gib:+.2f} GiB at mem_fraction_static "
            f"{plan.mem_fraction_static:.3f}")
    low = min(estimates, key=lambda e: e.rest_gib, default=None)
    if low is None or not plan.verdict.starts or low.rest_gib >= CALIBRATION_ERROR_GIB:
        return lines
    plan.verdict = FitVerdict.RISKY
    figures = ", ".join(f"{e.measurement.free_after_weights_gib:.2f}" for e in estimates)
    need = 1 - (low.free_after_weights_gib - CALIBRATION_ERROR_GIB) / low.free_before_weights_gib
    lines.append(
        f"risky: real starts of this model on this GPU measured {figures} GiB free after "
        f"weights; from the lowest this launch's rest is {low.rest_gib:+.2f} GiB (SGLang "
        f"refuses at 0, the calibration's error is {CALIBRATION_ERROR_GIB} GiB), from the planner "
        f"{plan.rest_gib:+.2f} GiB; only this box's own start says which holds "
        "(--calibrate its startup log)")
    plan.changes.insert(0, f"set mem_fraction_static to {math.ceil(need * 1000) / 1000:.3f} "
                        "or more: it clears the lowest measured start by the calibration's "
                        "error")
    return lines


def check_records(plan: Plan, record: Any, replan: Callable[[Layout], Plan]) -> Plan:
    """``plan`` (a prediction without a host's measurement) checked against the real
    starts ``record`` (a model record, or None) quotes for its GPU: Plan.measured holds
    what each says of this launch, the explanation names them and what the plan cannot
    see, and the verdict becomes "risky" where the lowest leaves no margin."""
    if plan.verdict == FitVerdict.INVALID:
        return plan
    mib = plan.defaults.get("gpu_memory_mib") if isinstance(plan.defaults, dict) else 0
    found = [m for m in matching(getattr(record, "measured", ()) or (), plan.gpu,
                                 float(mib or 0)) if m.tp <= plan.gpus]
    estimates = record_estimates(plan, found, replan) if found else []
    plan.measured = [e.to_dict() for e in estimates]
    plan.explanation += judge_record(plan, estimates)
    return plan


def apply_calibration(plan: Plan, measured_plan: Plan, measured: MeasuredStart) -> Plan:
    """``plan`` with the verdict, figures (Plan.calibrated) and lines of its calibration
    by ``measured``; a refused or risky one's changes start with the fraction that clears
    the uncertainty."""
    fit = calibrated_fit(plan, measured_plan, measured)
    plan.calibrated = fit.to_dict()
    plan.verdict = fit.verdict
    plan.explanation += fit.explanation
    if fit.verdict in (FitVerdict.REFUSED, FitVerdict.NO_KV, FitVerdict.RISKY):
        first = (f"set mem_fraction_static to {fit.safe_mfs:.3f} or more (measured: "
                 f"{fit.free_after_weights_gib:.2f} +- {fit.uncertainty_gib:.2f} GiB free "
                 "after weights)") if fit.safe_mfs < 1 else cannot_fit_change(
                     fit.free_after_weights_gib, fit.free_before_weights_gib)
        plan.changes = [first] + [c for c in plan.changes if not _fraction_change(c)]
    return plan


def _fraction_change(change: str) -> bool:
    """Whether a planner change sets the fraction (the calibrated one replaces it)."""
    return any(word in change for word in ("mem_fraction_static", "mem-fraction-static"))


def measured_layout(plan: Plan, measured: MeasuredStart) -> Layout:
    """The layout the measured start ran (its server_args), the rest of ``plan``'s; the
    plan's own layout when the log printed no server_args."""
    base = Layout(**{k: v for k, v in plan.layout.items() if k in Layout.__dataclass_fields__})
    o = measured.overrides()
    if not o:
        return base
    return replace(base, tp=o["tp"], ep=o["ep"], attn_dp=o["attn_dp"],
                   moe_a2a_backend=o["moe_a2a_backend"], speculative=o["speculative"],
                   draft_layers=base.draft_layers if o["speculative"] else None)


def calibrate_or_check(plan: Plan, *, record: Any, replan: Callable[[Layout], Plan],
                       measured: MeasuredStart | None = None, checkpoint: str | None = None
                       ) -> tuple[Plan, str | None]:
    """The one entry for every caller: ``plan`` calibrated by ``measured`` (the host's
    last start) when it is of the same ``checkpoint`` and version, else checked against
    the real starts ``record`` quotes. ``replan(layout)``: the planner with the caller's
    inputs on another layout. Returns the plan and why ``measured`` was not used (None
    when it was, or when there was none)."""
    why = measured.mismatch(checkpoint=checkpoint, sglang_version=plan.version) \
        if measured is not None else None
    if measured is None or why:
        return check_records(plan, record, replan), why
    return apply_calibration(plan, replan(measured_layout(plan, measured)), measured), None
