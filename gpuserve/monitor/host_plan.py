"""What the monitor deploy plans for one inventory host: its exporters (a GPU host with a
``profile``, or a gateway host), the Prometheus of the whole inventory (a host of the
``monitor`` group) and Grafana (a host of the ``grafana`` group).

Why one function: deploy/monitor.py (roles/deploys/monitor.py) and ``gpuserve check
--deploy monitor`` both call :func:`plan_monitor_host`, so check refuses exactly what the
deploy refuses (``monitor_scrape_interval``, ``monitor_retention``,
``grafana_keyring_sha256``, the exporters' ports ...), before any host is reached.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from gpuserve.errors import InputError
from gpuserve.monitor.dashboards import GrafanaPlan, plan_grafana
from gpuserve.monitor.exporters import ExportersPlan, plan_exporters
from gpuserve.monitor.plan import MonitorPlan, plan_monitor
from gpuserve.monitor.targets import HostEntry, scrape_address
from gpuserve.plans.router import is_router_host

MONITOR_GROUP = "monitor"
GRAFANA_GROUP = "grafana"
PROMETHEUS_PORT = 9090


@dataclass(frozen=True)
class MonitorHostPlan:
    """The parts of the monitor deploy one host gets (None: not this host's)."""

    exporters: ExportersPlan | None
    monitor: MonitorPlan | None
    grafana: GrafanaPlan | None

    @property
    def empty(self) -> bool:
        return self.exporters is None and self.monitor is None and self.grafana is None


def prometheus_url(monitor_hosts: list[tuple[str, dict]], source: str) -> str:
    """The first monitor host's Prometheus, as the grafana host reaches it."""
    if not monitor_hosts:
        raise InputError(source, GRAFANA_GROUP, "a grafana host needs a monitor host: add "
                         "one to the inventory's 'monitor' group")
    name, data = monitor_hosts[0]
    return f"http://{scrape_address(name, data, source)}:{PROMETHEUS_PORT}"


def applies(data: dict, groups: Collection[str]) -> bool:
    """Whether the monitor deploy does anything on a host with ``data`` in ``groups``."""
    return (bool(data.get("profile")) or is_router_host(data)
            or MONITOR_GROUP in groups or GRAFANA_GROUP in groups)


def plan_monitor_host(name: str, data: dict, groups: Collection[str],
                      entries: list[HostEntry], monitor_hosts: list[tuple[str, dict]],
                      source: str) -> MonitorHostPlan:
    """Every plan of the monitor deploy for host ``name`` (its ``data``, its inventory
    ``groups``), from the inventory's ``entries`` and its ``monitor`` group's hosts;
    bad host data is an ``InputError`` naming the inventory and key."""
    monitor = plan_monitor(entries, data, source, monitor_host=name) \
        if MONITOR_GROUP in groups else None
    gpu_host = bool(data.get("profile"))
    exporters = plan_exporters(data, source, gpu_host) \
        if gpu_host or is_router_host(data) else None
    grafana = plan_grafana(data, source, prometheus_url(monitor_hosts, source)) \
        if GRAFANA_GROUP in groups else None
    return MonitorHostPlan(exporters, monitor, grafana)
