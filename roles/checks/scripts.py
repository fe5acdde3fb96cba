"""The checks' host scripts: their names, the paths the deploy reads for them, and
their upload (before the service changes: a rolling switch runs the idle wait before
the restart).
"""

from __future__ import annotations

from pyinfra.api import deploy

from gpuserve.paths import SCRIPTS_DIR
from gpuserve.roles.base import managed
from gpuserve.roles.base.prefetch import Read

PROBE = "sglang_probe.py"
SMOKE = "sglang_smoke.py"
BENCH = "sglang_bench.py"
IDLE = "sglang_idle.py"  # a rolling switch's wait for in-flight requests (roles/router)
QUALITY = "sglang_quality.py"  # the output-quality check (roles/checks/quality.py)
JOB = "host_job.py"  # the job runner the benchmark's start imports
SCRIPTS = (PROBE, SMOKE, BENCH, IDLE, QUALITY, JOB)


def reads(bin_dir: str) -> list[Read]:
    """The paths :func:`install_check_scripts` manages, for the deploy's prefetch."""
    return [managed.read(bin_dir), *(managed.read(f"{bin_dir}/{s}") for s in SCRIPTS)]



@deploy("Host scripts of the checks")
def install_check_scripts(bin_dir: str) -> None:
    """Upload the probe, smoke, benchmark and idle scripts (before the service changes:
    a rolling switch runs the idle wait before the restart)."""
    managed.directory(name=f"{bin_dir} (gpuserve host scripts)", path=bin_dir, user="root",
                      group="root", mode="755")
    for script in SCRIPTS:
        managed.put(name=f"host script {bin_dir}/{script}", src=str(SCRIPTS_DIR / script),
                    dest=f"{bin_dir}/{script}", user="root", group="root", mode="755")
