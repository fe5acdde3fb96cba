"""The output-quality check of a launch, after its health gate and before its benchmark:
the prompt set sent by the host script (sglang_quality.py), judged on the controller
against the checkpoint's reference (gpuserve/quality/), recorded under
``results_dir/quality/``. A failed check rolls back like a failed gate and fails the
host, naming metric, value, threshold and reference (docs/quality.md).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pyinfra import host, logger, state
from pyinfra.api import FactBase, operation

from gpuserve.errors import InputError
from gpuserve.launch.quality_spec import QualitySpec
from gpuserve.measure.results import RecordSpec, utc_now
from gpuserve.quality.collect import QualityRunError, read_output, request_spec
from gpuserve.quality.judge import judge, summary_line, verdict_lines
from gpuserve.quality.prompts import Prompt, load_prompts
from gpuserve.quality.record import (
    QualityRun,
    newest_runs,
    read_reference,
    reference_path,
    write_reference,
    write_run,
)
from gpuserve.roles.base.failure import fail_host
from gpuserve.roles.checks.rollback import roll_back
from gpuserve.serve.checks import results_root

QUALITY = "sglang_quality.py"


@dataclass(frozen=True)
class QualityRequest:
    """What the check of one launch needs from the plan."""

    spec: QualitySpec
    record: RecordSpec | None  # where runs and the reference live (None: sanity only)
    revision: str | None = None  # the checkpoint's revision (a Hub commit), if known


def quality_request(plan) -> QualityRequest | None:
    """The serve plan's check (None when the profile says ``quality: {check: false}``)."""
    spec = plan.input.profile.quality
    if not spec.check or not plan.input.quality_check:
        return None
    weights = getattr(plan, "weights", None)
    return QualityRequest(spec=spec, record=plan.record,
                          revision=weights.commit if weights is not None else None)


class SglangQuality(FactBase):
    """The quality script's JSON document. Reads, never changes state."""

    def command(self, script: str, port: int, config: str, spec: str) -> str:
        return " ".join(shlex.quote(a) for a in (
            "python3", script, "--port", str(port), "--config", config, "--spec", spec))

    def process(self, output: list[str]) -> str:
        return "\n".join(output)


def reference_run(request: QualityRequest) -> tuple[QualityRun | None, str | None]:
    """The checkpoint's reference run and its file name, or (None, None)."""
    rec = request.record
    if rec is None:
        return None, None
    root = results_root(rec.results_dir)
    try:
        ref = read_reference(root, rec.model, request.revision)
    except (InputError, OSError) as e:
        logger.warning(f"{host.name}: quality: reference unreadable, judged on sanity: {e}")
        return None, None
    return ref, (reference_path(root, rec.model, request.revision).name if ref else None)


def preview_line(request: QualityRequest | None) -> str:
    """What ``--dry`` says about the check: whether, and against which reference."""
    if request is None:
        return "quality: not checked (the profile sets quality.check: false)"
    ref, name = reference_run(request)
    if ref is None:
        return ("quality: checked on sanity only; this launch becomes the reference of "
                "its checkpoint if it passes")
    return (f"quality: checked against reference {name} (profile {ref.profile}, SGLang "
            f"{ref.sglang_version}, launch {ref.launch_hash.split(':')[-1][:12]}, {ref.timestamp})")


def print_quality_preview(plan) -> None:
    """``--dry``'s line about the check (the preview's other lines: roles/base/preview.py)."""
    logger.info(f"{host.name}: preview: {preview_line(quality_request(plan))}")


def _already_passed(request: QualityRequest) -> bool:
    """The newest run of this host is this launch and passed: a rerun checks nothing."""
    rec = request.record
    if rec is None:
        return False
    runs = newest_runs(results_root(rec.results_dir), host.name)
    return bool(runs) and runs[-1][1].launch_hash == rec.launch_hash \
        and bool(runs[-1][1].verdict.get("passed"))


def measure(request: QualityRequest, port: int, script: str, config: str,
            ref: QualityRun | None, prompts: list[Prompt]) -> QualityRun:
    """Run the prompt set on the host; the unjudged run (QualityRunError: no usable
    answer at all)."""
    forced = ({p.id: p.output_ids for p in ref.prompts if p.kind == "completion"}
              if ref is not None else None)
    spec_arg = request_spec(prompts, request.spec.top_k, request.spec.timeout_s, forced)
    out = host.get_fact(SglangQuality, script=script, port=port, config=config, spec=spec_arg)
    results, elapsed = read_output(out, prompts)
    rec = request.record
    return QualityRun(host=host.name, profile=rec.profile if rec else "",
                      model=rec.model if rec else "", revision=request.revision,
                      sglang_version=rec.sglang_version if rec else "",
                      launch_hash=rec.launch_hash if rec else "", timestamp=utc_now(),
                      prompts=results, elapsed_s=elapsed)


def record_run(request: QualityRequest, run: QualityRun, ref: QualityRun | None) -> None:
    """Write the run; a passing run with no reference (or of the profile marked
    ``quality.reference``) becomes the checkpoint's reference."""
    if request.record is None:
        return
    root = results_root(request.record.results_dir)
    try:
        logger.info(f"{host.name}: quality: recorded {write_run(root, run)}")
        if run.verdict.get("passed") and (ref is None or request.spec.reference):
            logger.info(f"{host.name}: quality: reference of {run.model} recorded "
                        f"{write_reference(root, run)}")
    except OSError as e:
        logger.warning(f"{host.name}: quality: not recorded: {e}")


@operation(is_idempotent=True)
def quality_check(request: QualityRequest, port: int, profile: str, script: str,
                  config: str = "", rollback=None, health_script: str = "",
                  health_timeout: float = 600.0):
    """Check the served launch's output against its checkpoint's reference; on failure
    roll back (with ``rollback``) and fail the host naming the metric."""
    if not state.is_executing:  # --dry: print_quality_preview said it
        return
    if _already_passed(request):
        logger.info(f"{host.name}: quality: skipped, this launch passed its check already")
        return
    ref, ref_name = reference_run(request)
    try:
        prompts = load_prompts(request.spec.max_new_tokens)
        run = measure(request, port, script, config, ref, prompts)
    except (QualityRunError, InputError) as e:
        failed, details = f"quality: profile {profile}: the check could not be made: {e}", []
    else:
        verdict = judge(run, ref, request.spec, ref_name)
        record_run(request, run, ref)
        if verdict["passed"]:
            logger.info(f"{host.name}: quality: ok against "
                        f"{ref_name or 'no reference (sanity only)'}: {summary_line(run)}")
            return
        details = verdict_lines(verdict)
        failed = f"quality: profile {profile} failed its quality check: {details[0]}"
        details = details[1:]
    # "quality check:", not "quality:": the failure line below is the one a tune reads
    outcome = (yield from roll_back(rollback, port, health_script, health_timeout,
                                    what="quality check")) if rollback is not None else []
    yield fail_host(failed, details, outcome)
