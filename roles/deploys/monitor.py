"""The monitor deploy: exporters on every GPU host (node exporter on router hosts), and
Prometheus with targets, rules and alerts generated from the whole inventory on the
hosts of the ``monitor`` group. Called by deploy/monitor.py, or by a pyinfra project's
own deploy file. What is scraped and what each alert means: docs/metrics.md.
"""

from __future__ import annotations

from pyinfra import host, inventory, logger

from gpuserve.errors import InputError
from gpuserve.monitor.dashboards import plan_grafana
from gpuserve.monitor.exporters import plan_exporters
from gpuserve.monitor.plan import plan_monitor
from gpuserve.monitor.records import last_recorded_run
from gpuserve.monitor.targets import HostEntry, scrape_address
from gpuserve.plans.router import is_router_host
from gpuserve.roles import exporters as exporters_role
from gpuserve.roles import grafana as grafana_role
from gpuserve.roles import monitor as monitor_role
from gpuserve.roles.inventory import inventory_source, packaged_deploy
from gpuserve.roles.prefetch import prefetch

MONITOR_GROUP = "monitor"
GRAFANA_GROUP = "grafana"
PROMETHEUS_PORT = 9090


def prometheus_url(source: str) -> str:
    """The first monitor host's Prometheus, as the grafana host reaches it."""
    hosts = inventory.get_group(MONITOR_GROUP, default=None) or []
    if not hosts:
        raise InputError(source, GRAFANA_GROUP, "a grafana host needs a monitor host: add "
                         "one to the inventory's 'monitor' group")
    first = hosts[0]
    address = scrape_address(first.name, first.data.dict(), source)
    return f"http://{address}:{PROMETHEUS_PORT}"


def inventory_entries() -> list[HostEntry]:
    """Every host of the inventory with its first group and its last recorded run."""
    entries = []
    for other in inventory:
        data = other.data.dict()
        groups = [g for g in other.groups if g not in ("all", MONITOR_GROUP)]
        run, why = last_recorded_run(other.name, data) if data.get("profile") else (None, None)
        if why:
            logger.warning(f"{other.name}: records not read ({why}); its benchmark "
                           "threshold is left out")
        entries.append(HostEntry(other.name, data, groups[0] if groups else "ungrouped",
                                 run))
    return entries


@packaged_deploy
def monitor_fleet() -> None:
    """Exporters on this host when it serves SGLang (``profile``) or the gateway; the
    Prometheus of the whole inventory when it is in the ``monitor`` group; Grafana with
    the dashboards when it is in the ``grafana`` group."""
    data = host.data.dict()
    source = inventory_source()
    is_monitor = MONITOR_GROUP in host.groups
    if inventory.get_group(MONITOR_GROUP, default=None) is None:
        logger.warning("no 'monitor' group in the inventory: exporters only, nothing "
                       "scrapes them")
    monitor = plan_monitor(inventory_entries(), data, source, monitor_host=host.name) \
        if is_monitor else None
    gpu_host = bool(data.get("profile"))
    exporters = plan_exporters(data, source, gpu_host) \
        if gpu_host or is_router_host(data) else None
    grafana = plan_grafana(data, source, prometheus_url(source)) \
        if GRAFANA_GROUP in host.groups else None
    for line in (*(exporters.warnings if exporters else ()),
                 *(monitor.warnings if monitor else ())):
        logger.warning(f"{host.name}: {line}")
    if exporters is None and monitor is None and grafana is None:
        logger.info(f"{host.name}: neither a GPU, router, monitor nor grafana host; skipped")
        return
    prefetch([*(exporters_role.reads(exporters) if exporters else []),
              *(monitor_role.reads(monitor) if monitor else []),
              *(grafana_role.reads(grafana) if grafana else [])])
    if exporters is not None:
        exporters_role.install_exporters(plan=exporters)
    if monitor is not None:
        monitor_role.configure_monitor(plan=monitor)
    if grafana is not None:
        grafana_role.configure_grafana(plan=grafana)
