"""Check the served model, changing nothing: health gate (gate.py, probe.py), smoke
completion (smoke.py), throughput checks (bench.py), rollback after a failed one
(rollback.py), their host scripts (scripts.py); ``check_service`` runs them in order.

Why reads, not commands: pyinfra counts an operation that ran a command as a change, so
a ``curl`` health check would make every rerun report changes. The checks run their
probes as facts at execute time and yield nothing when they pass; a failed check yields
one ``FunctionCommand`` that fails the host. A passing smoke check may write a result
record on the controller; a failed health gate may first roll back to the last good
configuration.

How: docs/reruns.md, "gpuserve.roles.checks: how a check stays a read"
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy

from gpuserve.launch.bench import BenchMode
from gpuserve.plans.serve import ServePlan
from gpuserve.roles.base import planned
from gpuserve.roles.checks.bench import throughput_checks
from gpuserve.roles.checks.gate import wait_healthy
from gpuserve.roles.checks.quality import quality_check, quality_request
from gpuserve.roles.checks.scripts import BENCH, PROBE, QUALITY, SMOKE
from gpuserve.roles.checks.smoke import SmokeRequest, smoke_completion, smoked_start
from gpuserve.roles.service.rollback import RollbackSpec
from gpuserve.serve.checks import DEFAULTS as CHECK_DEFAULTS
from gpuserve.serve.service import UNIT_NAME

#: the host-data keys these checks read (defined beside their decisions)
DEFAULTS = CHECK_DEFAULTS

__all__ = ["DEFAULTS", "check_service"]

@deploy("Check SGLang")
def check_service(plan: ServePlan, rollback: RollbackSpec | None = None) -> None:
    """Gate on health (the scripts: :func:`install_check_scripts`), then one smoke
    completion (recorded on the controller when the plan records), then the throughput
    checks when the plan has them (roles/checks/bench.py). With ``rollback``, a failed
    gate restores the last good configuration first (see :func:`wait_healthy`). A
    multi-node rank > 0 serves no HTTP: the gate waits for the unit to run, and nothing
    else runs. One smoke per server start when the server's ``/health`` generates a token
    (``plan.smoke_per_start``): none while the start the newest smoke record measured
    still runs. The gate records the memory figures of a start this deploy made
    (``plan.start``: roles/checks/starts.py)."""
    unit, port, bin_dir = UNIT_NAME, plan.service.port, plan.bin_dir
    timeout, record, bench = plan.health_timeout, plan.record, plan.bench
    if not plan.serves_http:
        # a multi-node rank > 0: no HTTP here, so no smoke or throughput check either;
        # node 0's gate, smoke and checks cover the group
        planned.action(f"health gate: {unit} running (a read)", changes=False)
        wait_healthy(name=f"health gate: {unit} running (node serves no HTTP)", unit=unit,
                     port=0, script=f"{bin_dir}/{PROBE}", timeout=timeout,
                     rollback=rollback)
        return
    # one smoke per server start: none while the start the newest record measured runs
    unless_start = smoked_start(record.results_dir if record and plan.smoke_per_start
                                else None, host.name)
    planned.action(f"health gate on port {port} (a read; waits {timeout:g} s at most after "
                   "a restart)", changes=False)
    wait_healthy(name=f"health gate: {unit} answers /health 200",
                 unit=unit, port=port, script=f"{bin_dir}/{PROBE}", timeout=timeout,
                 rollback=rollback, smoke=SmokeRequest(port=port, model=plan.served_name,
                                                       config=plan.config_path,
                                                       unless_start=unless_start,
                                                       profile=plan.service.profile_name),
                 start=plan.start)
    planned.action("smoke completion (a read)", changes=False)
    smoke_completion(name=f"smoke completion on port {port}", port=port,
                     model=plan.served_name, profile=plan.service.profile_name,
                     script=f"{bin_dir}/{SMOKE}", config=plan.config_path,
                     record=record, unless_start=unless_start)
    quality = quality_request(plan)
    if quality is not None:
        planned.action("quality check against the checkpoint's reference (a read)",
                       changes=False)
        quality_check(name=f"quality check on port {port} (docs/quality.md)", request=quality,
                      port=port, profile=plan.service.profile_name,
                      script=f"{bin_dir}/{QUALITY}", config=plan.config_path,
                      rollback=rollback, health_script=f"{bin_dir}/{PROBE}",
                      health_timeout=timeout)
    if bench is not None and bench.mode != BenchMode.OFF:
        planned.action(f"throughput checks: bench {bench.mode} "
                       f"({len(bench.spec.scenarios)} scenarios)", changes=False)
        throughput_checks(name=f"throughput checks ({len(bench.spec.scenarios)} scenarios, "
                          f"SGLang's benchmark client)", plan=bench,
                          script=f"{bin_dir}/{BENCH}", record=record, rollback=rollback,
                          health_script=f"{bin_dir}/{PROBE}", health_timeout=timeout)
