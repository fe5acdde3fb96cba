"""Judge a candidate on the controller before any load: prune it, or predict it.

The serve deploy's own preflight (memory planner, doctor rules) on a host snapshot read
once, plus what only a tune knows: SGLang's "avail mem" of the incumbent's start, which
calibrates the planner's KV rest, and the host's measured gates (custom all-reduce needs
working P2P). Why: a candidate that cannot start is never loaded. Each pruned candidate
carries its reason and the numbers behind it.

How: docs/tune.md, "gpuserve.tune.judge: calibration and measured gates"
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from gpuserve.doctor.rules import diagnose, host_nccl_plan
from gpuserve.errors import InputError
from gpuserve.host.hostfacts import HostFacts
from gpuserve.host.nccl_env import sglang_flags_for_host
from gpuserve.memory import calibration
from gpuserve.memory.checkpoint import CheckpointScan, checkpoint_weights, parse_scan
from gpuserve.memory.draft import local_draft_dir
from gpuserve.memory.planner import FitVerdict
from gpuserve.memory.preflight import check_fit, launch_settings
from gpuserve.tune.predict import Comm, Prediction, host_box, predict
from gpuserve.tune.snapshot import HostSnapshot

_EXPERTS = "routed experts"
# the calibration's error and a draft's unknowns: one definition, shared with the serve
# preflight and gpuserve plan (gpuserve/memory/calibration.py)
__all__ = ["Verdict", "judge",
           "risk", "risky", "uncertainty"]


@dataclass
class Verdict:
    pruned: str | None = None  # why, or None: measure it
    numbers: dict = field(default_factory=dict)
    prediction: Prediction | None = None


def avail_after_weights(profile, scan: CheckpointScan, snapshot: HostSnapshot) -> float | None:
    """The planner's free GiB/GPU after weights for ``profile`` (None: not planned)."""
    fit = check_fit(profile, scan, snapshot.gpus, snapshot.sglang_version,
                    draft_scan=draft_scan(profile, snapshot))
    return fit.plan.avail_after_weights_gib if fit.plan else None


def draft_scan(profile, snapshot: HostSnapshot) -> CheckpointScan | None:
    """The candidate's separate draft as the snapshot read it on the host (its
    ``speculative.draft_model`` directory), else None: then its record, if it names one,
    or nothing (unknown) describes it. A scan that does not parse is treated as absent."""
    path = local_draft_dir(profile.speculative.draft_model, profile.model.path)
    text = snapshot.drafts.get(path) if path else None
    return _parsed(text, f"{snapshot.host}:{path}") if text else None


@lru_cache(maxsize=16)
def _parsed(text: str, source: str) -> CheckpointScan | None:
    try:
        return parse_scan(text, source)
    except InputError:
        return None


def judge(profile, scan: CheckpointScan | None, snapshot: HostSnapshot, *,
          calibration_gib: float | None, comm: Comm, peak_batch: int) -> Verdict:
    """Prune ``profile`` (a candidate) or predict it."""
    verdict = Verdict()
    if scan is not None and profile.model.path.startswith("/"):
        _memory(verdict, profile, scan, snapshot, calibration_gib)
        if verdict.pruned:
            return verdict
    _doctor(verdict, profile, snapshot)
    if verdict.pruned:
        return verdict
    _gates(verdict, profile, snapshot)
    if verdict.pruned:
        return verdict
    if scan is not None:
        verdict.prediction = _predict(profile, scan, snapshot, comm, peak_batch)
    return verdict


def _memory(verdict: Verdict, profile, scan: CheckpointScan, snapshot: HostSnapshot,
            calibration_gib: float | None) -> None:
    fit = check_fit(profile, scan, snapshot.gpus, snapshot.sglang_version,
                    draft_scan=draft_scan(profile, snapshot))
    plan = fit.plan
    if plan is not None:
        verdict.numbers.update({
            "weights_gib": round(plan.weights_gib, 2),
            "mem_fraction_static": round(plan.mem_fraction_static, 3),
            "rest_gib": round(plan.rest_gib, 2)})
        draft_numbers(verdict, plan.draft)
    calibrated = calibration_gib is not None and plan is not None and \
        plan.verdict in (FitVerdict.FITS, FitVerdict.TIGHT, FitVerdict.RISKY,
                         FitVerdict.REFUSED, FitVerdict.NO_KV)
    if not fit.ok and not calibrated:
        verdict.pruned = f"memory planner: {fit.message}"
        return
    if not calibrated:
        return
    cal = calibration.offset_fit(plan, calibration_gib,
                                 uncertainty_gib=uncertainty(profile, plan.draft))
    rest = cal.rest_gib
    verdict.numbers["calibrated_rest_gib"] = round(rest, 2)
    verdict.numbers["calibration_gib"] = round(calibration_gib, 2)
    verdict.numbers["uncertainty_gib"] = round(cal.uncertainty_gib, 2)
    if rest <= 0:
        total = plan.pre_load_free_gib
        verdict.pruned = (
            f"memory, calibrated on this host: {cal.free_after_weights_gib:.2f} GiB/GPU free "
            f"after weights (planner {plan.avail_after_weights_gib:.2f} {calibration_gib:+.2f} "
            f"measured offset), mem_fraction_static {plan.mem_fraction_static:.3f} reserves "
            f"{total * (1 - plan.mem_fraction_static):.2f} GiB: rest {rest:.2f} GiB, SGLang "
            "would stop with 'Not enough memory'"
            + (f"; fits from mem_fraction_static {cal.min_viable_mfs:.3f}" if total else ""))


def draft_numbers(verdict: Verdict, draft: dict | None) -> None:
    """The plan's draft figures: what it adds and the room it leaves outside the static
    pool, whose error is the draft graphs' estimate (never a prune: SGLang's own estimate
    of the target's graphs and activations, which the room is measured from, is generous;
    a short room loads last instead)."""
    if not draft:
        return
    verdict.numbers.update({
        "draft_weights_gib": draft["weights_gib"], "draft_graphs_gib": draft["graphs_gib"],
        "draft_kv_extra_gib": draft["kv_extra_gib"], "draft_room_gib": draft["room_gib"],
        "draft_room_error_gib": draft["graphs_gib"]})


def uncertainty(profile, draft: dict | None = None) -> float:
    """GiB by which a calibrated rest may be wrong for ``profile`` (a candidate):
    gpuserve.memory.calibration.uncertainty of its speculative algorithm and the plan's
    draft figures ``draft``."""
    return calibration.uncertainty(profile.speculative.algorithm, draft)


def risk(verdict: Verdict) -> str | None:
    """Why the candidate may well die at start (None: it surely fits as far as the plan
    knows): its calibrated room lies inside its uncertainty, or the room its draft leaves
    outside the static pool lies inside the draft graphs' estimate."""
    n = verdict.numbers
    rest, error = n.get("calibrated_rest_gib"), n.get("uncertainty_gib")
    if isinstance(rest, int | float) and isinstance(error, int | float) and rest < error:
        return (f"calibrated room {rest:+.2f} GiB is inside its uncertainty "
                f"({error:.2f} GiB)")
    room, graphs = n.get("draft_room_gib"), n.get("draft_room_error_gib")
    if isinstance(room, int | float) and isinstance(graphs, int | float) and room < graphs:
        return (f"the draft's room outside the static pool {room:+.2f} GiB is inside its "
                f"CUDA graphs' estimate ({graphs:.2f} GiB; its pool beyond the KV budget "
                f"{n.get('draft_kv_extra_gib', 0):.2f} GiB)")
    return None


def risky(verdict: Verdict) -> bool:
    """Whether the candidate may well die at start (``risk``): it loads after every
    candidate that surely fits."""
    return risk(verdict) is not None


def _doctor(verdict: Verdict, profile, snapshot: HostSnapshot) -> None:
    if not snapshot.host_facts:
        return
    facts = HostFacts.from_dict(snapshot.host_facts, f"{snapshot.host}: host facts")
    errors = [f for f in diagnose(profile, facts, snapshot.sglang_version)
              if f.severity == "error"]
    if errors:
        f = errors[0]
        verdict.pruned = f"doctor {f.id}: {f.evidence} (fix: {f.fix})"


def _host_turns_custom_all_reduce_off(snapshot: HostSnapshot) -> bool:
    """Whether the serve deploy adds ``--disable-custom-all-reduce`` on this host: its
    host.json says so (the measured choice); without one, what the host deploy would
    write from the host's facts (gpuserve.doctor.rules.host_nccl_plan)."""
    if snapshot.host_json:
        try:
            return bool(sglang_flags_for_host(snapshot.host_json.splitlines()))
        except InputError:
            return False  # the serve deploy refuses it by name before any load
    if not snapshot.host_facts:
        return False
    facts = HostFacts.from_dict(snapshot.host_facts, f"{snapshot.host}: host facts")
    return host_nccl_plan(facts).disable_custom_all_reduce


def _gates(verdict: Verdict, profile, snapshot: HostSnapshot) -> None:
    if profile.parallel.tp <= 1 or profile.communication.disable_custom_all_reduce:
        return
    if _host_turns_custom_all_reduce_off(snapshot):
        return  # the candidate runs without custom all-reduce: nothing needs P2P
    facts = snapshot.host_facts or {}
    measured = facts.get("measured") if isinstance(facts, dict) else None
    p2p = measured.get("p2p") if isinstance(measured, dict) else None
    if p2p is not True:
        result = measured.get("p2p_result") if isinstance(measured, dict) else None
        verdict.pruned = ("host gates: custom all-reduce needs GPU peer access, and this "
                          f"host's P2P was not measured working (p2p_result: "
                          f"{result or 'not measured'})")


def _predict(profile, scan: CheckpointScan, snapshot: HostSnapshot, comm: Comm,
             peak_batch: int) -> Prediction | None:
    """The throughput predictor's figures for the candidate on this host, with the
    weights the host's checkpoint holds per GPU."""
    from gpuserve.throughput.plan import launch_of

    settings = launch_settings(profile)
    arch = scan.arch(profile.model.arch or None)
    launch = launch_of(profile, settings)
    facts = snapshot.host_facts if isinstance(snapshot.host_facts, dict) else {}
    try:
        return predict(arch=arch, layout=launch.layout, spec=launch.spec,
                       kv_dtype=launch.kv_dtype,
                       box=host_box(snapshot.gpu_name, comm, facts.get("measured")),
                       peak_batch=peak_batch, parts=checkpoint_weights(scan, settings.layout, arch))
    except InputError:
        return None  # a launch the arithmetic cannot size (an unmodelled KV dtype)
