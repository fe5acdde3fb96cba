"""The serve deploy's last check before any service change: will this profile fit, and
do the doctor's rules allow it on this host?

Why here, at prepare time: a profile that cannot fit is otherwise found out by SGLang
after a ten-minute weight load, and then rolled back. The memory figures come from the
checkpoint on the host (its safetensors headers, read by ``checkpoint_scan.py`` as a
fact: gpuserve.facts.host.ModelCheckpoint), not from a model record that can drift from
it; the GPUs from the NvidiaGpus fact; the defaults from the pinned SGLang version
(gpuserve.memory.preflight.check_fit). The doctor's rules run on the host-facts document
(gpuserve.facts.document) in the same step.

Host data ``preflight``: ``enforce`` (default: a misfit or a doctor error refuses the
deploy, naming profile and fix, before any operation exists), ``warn`` (printed, the
deploy goes on) or ``off``. A "risky" memory fit (gpuserve.memory.calibration: real
measurements disagree about it, or its calibrated margin lies inside its uncertainty) is
a warning in every mode: it may well start, and a refusal would block launches that run.
What cannot be judged is said and not refused: no GPU
visible yet (no driver), a model path that is a hub id rather than a directory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from gpuserve.doctor.rules import diagnose
from gpuserve.errors import InputError, one_of
from gpuserve.host.hostfacts import HostFacts
from gpuserve.launch.lock_choice import PreflightError
from gpuserve.measure.starts import (
    Checkpoint,
    StartRecord,
    checkpoint_digest,
    gpu_of,
    last_measured,
    launch_of,
    to_measured,
)
from gpuserve.memory.calibration import calibrate_or_check
from gpuserve.memory.checkpoint import CheckpointScan, parse_scan
from gpuserve.memory.draft import SEPARATE_DRAFT, local_draft_dir
from gpuserve.memory.models import load_record
from gpuserve.memory.planner import FitVerdict, Plan, PlanRequest, predict
from gpuserve.memory.preflight import (
    LaunchSettings,
    check_fit,
    init_overhead,
    launch_settings,
    sm_major,
)


class PreflightMode(StrEnum):
    """Host data ``preflight``: what a profile that does not fit does."""

    ENFORCE = "enforce"  # refused before any change
    WARN = "warn"
    OFF = "off"  # no memory fit, no checkpoint read


MODES = tuple(PreflightMode)


def validate_mode(value: Any, source: str) -> PreflightMode:
    """Host data ``preflight``: ``enforce`` (refuse), ``warn`` or ``off``."""
    return PreflightMode(one_of(value, source, "preflight", MODES, "enforce"))


@dataclass
class PreflightReport:
    """What the step found: lines to print (info) and warnings; errors were raised.
    ``checkpoint``: the identity of the checkpoint it scanned (None: not scanned), which
    the start record of this deploy carries."""

    info: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    checkpoint: Checkpoint | None = None
    measured: StartRecord | None = None  # the host's start the memory fit calibrated by


def run_preflight(mode: str, *, host: str, profile, version: str, gpus: list[dict],
                  checkpoint: Callable[[str], str | None] | None,
                  host_facts: Callable[[], dict | None] | None,
                  starts: Callable[[], list[StartRecord]] | None = None) -> PreflightReport:
    """Memory fit from the checkpoint, then the doctor; raise PreflightError (enforce)
    or return warnings (warn). ``checkpoint(path)`` returns the scan's JSON text;
    ``host_facts()`` the host-facts document; either may be None (not available).
    ``starts()``: the host's recorded starts (gpuserve/measure/starts.py); the last one
    of this checkpoint and version calibrates the memory fit."""
    report = PreflightReport()
    if mode == PreflightMode.OFF:
        return report
    refusals: list[str] = []
    _memory(report, refusals, host=host, profile=profile, version=version, gpus=gpus,
            checkpoint=checkpoint, starts=starts)
    _doctor(report, refusals, profile=profile, version=version, host_facts=host_facts,
            measured=report.measured)
    if refusals and mode == PreflightMode.ENFORCE:
        raise PreflightError("\n".join(
            [f"{host}: preflight: " + _indented(r) for r in refusals]
            + [f"    profile file: {profile.source}; nothing on the host was changed "
               "(host data preflight: warn or off to deploy anyway)"]))
    report.warnings += [f"preflight: {_indented(r)}" for r in refusals]
    return report


def _indented(refusal: str) -> str:
    """A refusal's first line, its details on the following lines, indented."""
    return "\n    ".join(refusal.split("\n"))


def _memory(report: PreflightReport, refusals: list[str], *, host: str, profile,
            version: str, gpus: list[dict], checkpoint, starts=None) -> None:
    path = profile.model.path
    if checkpoint is None:
        return
    if not path.startswith("/"):
        report.warnings.append(f"preflight: model.path {path!r} is not a local directory "
                               "(a hub id): memory not checked against a checkpoint, and "
                               "the service runs offline (HF_HUB_OFFLINE=1), so it must be "
                               "in the service's cache already; model.hf: org/name@<commit> "
                               "has the deploy fetch and verify it (docs/weights.md)")
        return
    if not gpus:
        report.warnings.append("preflight: no GPU visible on the host yet (nvidia-smi "
                               "absent or no driver loaded): memory fit not checked")
        return
    text = checkpoint(path) or ""
    try:
        scan = parse_scan(text, f"{host}:{path}")
    except InputError as e:
        refusals.append(f"checkpoint {e}")
        return
    report.checkpoint = Checkpoint(path, checkpoint_digest(
        [(f.name, f.size) for f in scan.files]))
    measured = report.measured = last_measured(starts() if starts else [],
                                               report.checkpoint, version, gpu_of(gpus),
                                               launch_of(profile))
    draft = _draft_scan(report, host=host, profile=profile, checkpoint=checkpoint)
    try:
        fit = check_fit(profile, scan, gpus, version, draft_scan=draft,
                        measured=to_measured(measured) if measured is not None else None)
    except InputError as e:
        if measured is None:
            raise
        # a record that contradicts the host (figures no card of it holds) measured
        # something else: planned without it, and said
        report.warnings.append(f"preflight: this host's start {measured.source} cannot "
                               f"calibrate this launch ({e.field}: {e.message}); planned "
                               "without it")
        measured = report.measured = None
        fit = check_fit(profile, scan, gpus, version, draft_scan=draft)
    if measured is not None:
        report.info.append(f"preflight: calibrated by this host's start of "
                           f"{measured.timestamp} ({measured.source})")
    report.info += [f"preflight: {line}" for line in fit.lines]
    report.warnings += [f"preflight: {note}" for note in fit.notes]
    if not fit.ok:
        refusals.append(fit.message)
    elif fit.verdict.starts:
        report.info.append(f"preflight: profile {profile.name} fits ({fit.verdict})")
    # a risky fit (measurements disagree, or a calibrated margin inside its uncertainty)
    # goes ahead in every mode: its reason and the fraction that clears it are in the notes,
    # printed above as warnings


def _draft_scan(report: PreflightReport, *, host: str, profile, checkpoint
                ) -> CheckpointScan | None:
    """A separate draft's checkpoint on the host (a local ``speculative.draft_model``
    other than the target's own directory), read like the target's, so the plan charges
    its real weights. One that cannot be read is a warning: the draft is then planned
    from its record (``speculative.draft_arch``) or said to be unknown."""
    spec = profile.speculative
    path = local_draft_dir(spec.draft_model, profile.model.path)
    if (spec.algorithm or "").upper() not in SEPARATE_DRAFT or path is None:
        return None
    try:
        return parse_scan(checkpoint(path) or "", f"{host}:{path}")
    except InputError as e:
        report.warnings.append(
            f"preflight: draft checkpoint {e}: the draft is planned "
            + (f"from its record {spec.draft_arch}" if spec.draft_arch
               else "without its weights (set speculative.draft_arch)"))
        return None


def _doctor(report: PreflightReport, refusals: list[str], *, profile, version: str,
            host_facts, measured: StartRecord | None = None) -> None:
    document = host_facts() if host_facts is not None else None
    if not document:
        return
    facts = HostFacts.from_dict(document, "<host facts>")
    calibrated = to_measured(measured) if measured is not None else None
    memory_refused = bool(refusals)  # said once, by the memory fit, with its fix
    for f in diagnose(profile, facts, version, calibrated):
        if memory_refused and f.id == "memory-plan":
            continue
        line = f"doctor {f.severity} {f.id}: {f.evidence} (fix: {f.fix})"
        if f.severity == "error":
            refusals.append(line)
        elif f.severity == "warn":
            report.warnings.append(f"preflight: {line}")


def recorded_fit(profile, version: str, start: StartRecord) -> Plan | None:
    """``profile`` planned from its model record on the card ``start`` ran on, calibrated
    by that start (gpuserve.memory.calibration): the memory fit of a check that reads no
    host (``gpuserve check``). None where the profile names no record, the start kept no
    GPU, or the planner does not model the launch."""
    if not profile.model.arch or not start.gpu:
        return None
    try:
        record = load_record(profile.model.arch)
    except InputError:
        return None
    gpu, measured = start.gpu, to_measured(start)

    def plan_for(settings: LaunchSettings) -> Plan:
        return predict(record, PlanRequest(
            gpu_memory_mib=gpu["memory_total_mib"], gpu_name=gpu["name"],
            gpu_count=gpu["count"], sm_major=sm_major(gpu["compute_cap"]),
            init_overhead_gib=init_overhead(gpu["name"]), layout=settings.layout,
            version=version, record=record, **settings.knobs))

    settings = launch_settings(profile)
    try:
        return calibrate_or_check(
            plan_for(settings), record=record, measured=measured,
            checkpoint=profile.model.path,
            replan=lambda layout: plan_for(replace(settings, layout=layout)))[0]
    except (ValueError, InputError):
        return None


def recorded_verdict(profile, version: str, start: StartRecord
                     ) -> tuple[bool, list[str]] | None:
    """(whether it may start, the lines that say why) of :func:`recorded_fit`."""
    plan = recorded_fit(profile, version, start)
    if plan is None or not plan.calibrated:
        return None
    lines = [f"memory calibrated by the host's start of {start.timestamp} "
             f"({start.source}): {plan.verdict}", *plan.calibrated["explanation"]]
    ok = plan.verdict.starts or plan.verdict == FitVerdict.RISKY
    return ok, lines + ([plan.changes[0]] if plan.changes and not ok else [])
