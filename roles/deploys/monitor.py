"""The monitor deploy: exporters on every GPU host (node exporter on router hosts), and
Prometheus with targets, rules and alerts generated from the whole inventory on the
hosts of the ``monitor`` group. Called by deploy/monitor.py, or by a pyinfra project's
own deploy file. What is scraped and what each alert means: docs/metrics.md.
"""

from __future__ import annotations

from pyinfra import host, inventory, logger

from gpuserve.monitor.host_plan import MONITOR_GROUP, plan_monitor_host
from gpuserve.monitor.records import Recorded, recorded
from gpuserve.monitor.targets import HostEntry
from gpuserve.roles import exporters as exporters_role
from gpuserve.roles import grafana as grafana_role
from gpuserve.roles import monitor as monitor_role
from gpuserve.roles.base.inventory import inventory_source, packaged_deploy
from gpuserve.roles.base.prefetch import prefetch


def inventory_entries() -> list[HostEntry]:
    """Every host of the inventory with its first group and its last recorded run."""
    entries = []
    for other in inventory:
        data = other.data.dict()
        groups = [g for g in other.groups if g not in ("all", MONITOR_GROUP)]
        records = recorded(other.name, data) if data.get("profile") else Recorded()
        run, running, why = records.run, records.running, records.error
        if why:
            logger.warning(f"{other.name}: records not read ({why}); its benchmark "
                           "threshold is left out")
        entries.append(HostEntry(other.name, data, groups[0] if groups else "ungrouped",
                                 run, running.profile if running else None,
                                 records.removed))
    return entries


@packaged_deploy
def monitor_fleet() -> None:
    """Exporters on this host when it serves SGLang (``profile``) or the gateway; the
    Prometheus of the whole inventory when it is in the ``monitor`` group; Grafana with
    the dashboards when it is in the ``grafana`` group."""
    data = host.data.dict()
    source = inventory_source()
    if inventory.get_group(MONITOR_GROUP, default=None) is None:
        logger.warning("no 'monitor' group in the inventory: exporters only, nothing "
                       "scrapes them")
    monitor_hosts = [(h.name, h.data.dict())
                     for h in inventory.get_group(MONITOR_GROUP, default=None) or []]
    entries = inventory_entries() if MONITOR_GROUP in host.groups else []
    plan = plan_monitor_host(host.name, data, host.groups, entries, monitor_hosts, source)
    exporters, monitor, grafana = plan.exporters, plan.monitor, plan.grafana
    for line in (*(exporters.warnings if exporters else ()),
                 *(monitor.warnings if monitor else ())):
        logger.warning(f"{host.name}: {line}")
    if plan.empty:
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
