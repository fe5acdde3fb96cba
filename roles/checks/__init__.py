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
from gpuserve.measure.results import RecordSpec
from gpuserve.measure.starts import StartSpec
from gpuserve.roles.checks.bench import throughput_checks
from gpuserve.roles.checks.gate import wait_healthy
from gpuserve.roles.checks.probe import (
    BATCH_PROBE_MAX_AGE,
    SglangProbe,
    serving_probe,
    serving_probe_read,
)
from gpuserve.roles.checks.quality import QualityRequest, quality_check
from gpuserve.roles.checks.rollback import roll_back
from gpuserve.roles.checks.scripts import (
    BENCH,
    IDLE,
    PROBE,
    QUALITY,
    SCRIPTS,
    SMOKE,
    install_check_scripts,
    reads,
)
from gpuserve.roles.checks.smoke import (
    SglangSmoke,
    SmokeRequest,
    smoke_completion,
    smoked_start,
)
from gpuserve.roles.service.rollback import RollbackSpec
from gpuserve.serve.checks import DEFAULTS, BenchPlan, results_root

__all__ = ["BATCH_PROBE_MAX_AGE", "BENCH", "DEFAULTS", "IDLE", "PROBE", "SCRIPTS", "SMOKE",
           "SglangProbe", "SglangSmoke", "SmokeRequest", "check_service",
           "install_check_scripts", "reads", "results_root", "roll_back", "serving_probe",
           "serving_probe_read", "smoke_completion", "throughput_checks", "wait_healthy"]


@deploy("Check SGLang")
def check_service(unit: str, port: int, served_name: str, profile_name: str,
                  bin_dir: str, health_timeout: float, config_path: str = "",
                  record: RecordSpec | None = None,
                  rollback: RollbackSpec | None = None,
                  bench: BenchPlan | None = None, serves_http: bool = True,
                  smoke_per_start: bool = True, start: StartSpec | None = None,
                  quality: QualityRequest | None = None) -> None:
    """Gate on health (the scripts: :func:`install_check_scripts`), then one smoke
    completion (recorded on the controller when ``record`` is given), then the
    throughput checks when ``bench`` is given (roles/checks/bench.py). With
    ``rollback``, a failed gate restores the last good configuration first (see
    :func:`wait_healthy`). ``serves_http`` False (a multi-node rank > 0): the gate
    waits for the unit to run, and nothing else runs. ``smoke_per_start`` (the server's
    ``/health`` generates a token: gpuserve.measure.health.health_generates): no smoke
    while the start the newest smoke record measured still runs; False: one every run.
    ``start``: the gate records the memory figures of a start this deploy made
    (roles/checks/starts.py). ``quality``: the output-quality check between the smoke
    and the throughput checks (roles/checks/quality.py)."""
    if not serves_http:
        # a multi-node rank > 0: no HTTP here, so no smoke or throughput check either;
        # node 0's gate, smoke and checks cover the group
        wait_healthy(name=f"health gate: {unit} running (node serves no HTTP)", unit=unit,
                     port=0, script=f"{bin_dir}/{PROBE}", timeout=health_timeout,
                     rollback=rollback)
        return
    # one smoke per server start: none while the start the newest record measured runs
    unless_start = smoked_start(record.results_dir if record and smoke_per_start else None,
                                host.name)
    wait_healthy(name=f"health gate: {unit} answers /health 200",
                 unit=unit, port=port, script=f"{bin_dir}/{PROBE}", timeout=health_timeout,
                 rollback=rollback, smoke=SmokeRequest(port=port, model=served_name,
                                                       config=config_path,
                                                       unless_start=unless_start),
                 profile_name=profile_name, start=start)
    smoke_completion(name=f"smoke completion on port {port}", port=port, model=served_name,
                     profile=profile_name, script=f"{bin_dir}/{SMOKE}", config=config_path,
                     record=record, unless_start=unless_start)
    if quality is not None:
        quality_check(name=f"quality check on port {port} (docs/quality.md)", request=quality,
                      port=port, profile=profile_name, script=f"{bin_dir}/{QUALITY}",
                      config=config_path, rollback=rollback,
                      health_script=f"{bin_dir}/{PROBE}", health_timeout=health_timeout)
    if bench is not None and bench.mode != BenchMode.OFF:
        throughput_checks(name=f"throughput checks ({len(bench.spec.scenarios)} scenarios, "
                          f"SGLang's benchmark client)", plan=bench,
                          script=f"{bin_dir}/{BENCH}", record=record, rollback=rollback,
                          health_script=f"{bin_dir}/{PROBE}", health_timeout=health_timeout)
