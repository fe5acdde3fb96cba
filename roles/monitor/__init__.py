"""Prometheus (and Alertmanager) from the distribution on a monitor host, configured
from the inventory (gpuserve/monitor/plan.py).

Why Debian's packages: prometheus, promtool and prometheus-alertmanager are in the
archive with their units, users and /etc/default files, so the role writes files only.
A changed config or rule file is checked with the package's own promtool on the host
first, then Prometheus reloads (SIGHUP, its unit's ExecReload); a changed target file
needs nothing (file-based discovery rereads it). How: docs/metrics.md.
"""

from __future__ import annotations

import shlex

from pyinfra.api import QuoteString, StringCommand, deploy, operation

from gpuserve.monitor.plan import (
    CONFIG_PATH,
    DEFAULTS_PATH,
    MONITOR_DEFAULTS,
    OWN_DIR,
    RULES_DIR,
    TARGETS_DIR,
    MonitorPlan,
)
from gpuserve.roles.base import managed
from gpuserve.roles.base.prefetch import Read
from gpuserve.roles.service import activation_steps

DEFAULTS = MONITOR_DEFAULTS
UNIT = "prometheus.service"
ALERTMANAGER_UNIT = "prometheus-alertmanager.service"
DIRECTORIES = (OWN_DIR, TARGETS_DIR, RULES_DIR)

__all__ = ["DEFAULTS", "configure_monitor", "reads"]


def packages(plan: MonitorPlan) -> list[str]:
    return ["prometheus", *(["prometheus-alertmanager"] if plan.alertmanager else [])]


def reads(plan: MonitorPlan) -> list[Read]:
    """Everything the role reads, for the deploy's prefetch."""
    return [*(managed.read_package(p) for p in packages(plan)),
            *(managed.read(p) for p in (*DIRECTORIES, *plan.files)),
            managed.read_unit(UNIT, (DEFAULTS_PATH,)),
            *([managed.read_unit(ALERTMANAGER_UNIT)] if plan.alertmanager else [])]


@operation()
def _check_and_reload():
    """promtool on the host's files (a bad file stops here, the running Prometheus
    keeps its old rules), then Prometheus rereads them."""
    yield StringCommand("sh", "-c", QuoteString(
        f"promtool check config {shlex.quote(CONFIG_PATH)} && systemctl reload {UNIT}"))


@deploy("Monitor")
def configure_monitor(plan: MonitorPlan) -> None:
    """Install the packages, write the plan's files, reload or (re)start Prometheus."""
    installed = managed.packages(name="Install Prometheus", packages=packages(plan),
                                 update=True)
    for path in DIRECTORIES:
        managed.directory(name=f"Directory {path}", path=path, user="root", group="root",
                          mode="755")
    changed = {path: managed.put(name=f"Write {path}", dest=path, text=text, user="root",
                                 group="root", mode="644")
               for path, text in plan.files.items()}
    restart_files = changed[DEFAULTS_PATH] is not None or installed is not None
    reload_files = any(op is not None for path, op in changed.items()
                       if path != DEFAULTS_PATH and not path.startswith(TARGETS_DIR))
    # only the arguments file needs a restart (the config a reload: a config newer than
    # the process is the normal state after one, not a reason to restart)
    live = managed.unit_state(UNIT, (DEFAULTS_PATH,))
    steps = activation_steps(live, restart_files, False)
    if steps:
        managed.systemctl(name="Activate Prometheus", unit=UNIT, steps=tuple(steps))
    elif reload_files:
        _check_and_reload(name="Check and reload Prometheus")
    if plan.alertmanager:
        am = activation_steps(managed.unit_state(ALERTMANAGER_UNIT), installed is not None,
                              False)
        if am:
            managed.systemctl(name="Activate Alertmanager", unit=ALERTMANAGER_UNIT,
                              steps=tuple(am))
