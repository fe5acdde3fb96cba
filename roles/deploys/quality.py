"""``gpuserve quality INVENTORY --limit HOST``'s deploy: the output-quality check of the
launch the host serves now, on demand, recorded like the serve deploy's check
(roles/checks/quality.py) and written as one document for the command to print. It
changes nothing on the host (no rollback: a person decides what to do with a failure).

Host data: the serve deploy's keys, plus ``operate_snapshot`` (the controller path the
document is written to; set by the command) and ``quality_reference`` (true: make this
run the checkpoint's reference when it passes).
"""

from __future__ import annotations

from dataclasses import replace

from pyinfra import host

from gpuserve.errors import InputError
from gpuserve.measure.results import utc_now
from gpuserve.quality.collect import QualityRunError
from gpuserve.quality.judge import judge, summary_line, verdict_lines
from gpuserve.quality.prompts import load_prompts
from gpuserve.roles.base.inventory import inventory_source, packaged_deploy
from gpuserve.roles.checks.quality import (
    QUALITY,
    measure,
    quality_request,
    record_run,
    reference_run,
)
from gpuserve.roles.deploys.operate import snapshot_target, write_snapshot
from gpuserve.roles.deploys.serve import plan_and_read

SCHEMA = "gpuserve.quality-check/1"


@packaged_deploy
def quality_now() -> None:
    """Check the served launch's output now and write the verdict (see module doc)."""
    target = snapshot_target()
    plan = plan_and_read()
    request = quality_request(plan)
    if request is None:
        raise InputError(inventory_source(), "profile", "its quality.check is false")
    make_ref = host.data.get("quality_reference")
    if make_ref not in (None, True, False, "true", "false", "True", "False"):
        raise InputError(inventory_source(), "quality_reference", "must be true or false")
    if str(make_ref).lower() == "true":
        request = replace(request, spec=replace(request.spec, reference=True))
    ref, ref_name = reference_run(request)
    doc = {"schema": SCHEMA, "host": host.name, "taken": utc_now(),
           "profile": plan.service.profile_name}
    try:
        run = measure(request, plan.service.port, f"{plan.bin_dir}/{QUALITY}",
                      plan.config_path, ref, load_prompts(request.spec.max_new_tokens))
    except QualityRunError as e:
        doc.update(passed=False, error=str(e))
    else:
        verdict = judge(run, ref, request.spec, ref_name)
        record_run(request, run, ref)
        doc.update(passed=verdict["passed"], reference=ref_name, summary=summary_line(run),
                   figures=run.figures, failures=verdict_lines(verdict),
                   findings=verdict["findings"])
    write_snapshot(target, doc)
