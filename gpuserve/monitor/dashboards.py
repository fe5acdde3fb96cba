"""Grafana dashboards as files: the fleet dashboard of our own (built here), the
upstream ones the grafana host fetches from their pinned sources (NVIDIA's DCGM
dashboard, SGLang's: gpuserve/monitor/upstream_dashboards.py), and the provisioning
files that load them into Grafana from disk on a ``grafana`` host.

Why built in code: its panels name our recording rules and labels (host, profile), so
one source keeps the dashboard, the rules and the tests in step.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from gpuserve.errors import InputError
from gpuserve.host import mirrors
from gpuserve.monitor.upstream_dashboards import DashboardFetch, plan_fetches

FLEET_FILE = "gpuserve-fleet.json"
FLEET_UID = "gpuserve-fleet"
GRAFANA_DASHBOARDS = "/var/lib/grafana/dashboards/gpuserve"
PROVISIONING = "/etc/grafana/provisioning"
DATASOURCE_UID = "gpuserve-prometheus"

#: (title, unit, [(PromQL, legend)]) per panel, two per row
FLEET_PANELS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ("Generated tokens/s per host", "none", (
        ("gpuserve:gen_tokens_per_second:rate1m", "{{host}} ({{profile}})"),)),
    ("Generated tokens/s per profile", "none", (
        ("sum by (profile) (gpuserve:gen_tokens_per_second:rate1m)", "{{profile}}"),)),
    ("Running requests", "none", (("gpuserve:running_reqs", "{{host}}"),)),
    ("Queued requests", "none", (("gpuserve:queue_reqs", "{{host}}"),)),
    ("KV cache usage", "percentunit", (("gpuserve:kv_usage:max", "{{host}}"),)),
    ("TTFT p50 / p99", "s", (("gpuserve:ttft_seconds:p50_5m", "p50 {{host}}"),
                             ("gpuserve:ttft_seconds:p99_5m", "p99 {{host}}"))),
    ("ITL p50 / p99", "s", (
        ("histogram_quantile(0.5, sum by (host, le) "
         "(rate(sglang:inter_token_latency_seconds_bucket[5m])))", "p50 {{host}}"),
        ("gpuserve:itl_seconds:p99_5m", "p99 {{host}}"))),
    ("GPU power", "watt", (("sum by (host) (DCGM_FI_DEV_POWER_USAGE)", "{{host}}"),)),
    ("PCIe throughput", "Bps", (
        ("sum by (host) (DCGM_FI_PROF_PCIE_TX_BYTES)", "tx {{host}}"),
        ("sum by (host) (DCGM_FI_PROF_PCIE_RX_BYTES)", "rx {{host}}"))),
    ("NVLink throughput", "Bps", (
        ("sum by (host) (rate(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL[5m]))", "{{host}}"),)),
)


def _panel(index: int, title: str, unit: str, queries) -> dict:
    return {
        "id": index + 1, "type": "timeseries", "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom",
                               "showLegend": True}},
        "targets": [{"refId": chr(ord("A") + n), "expr": expr, "legendFormat": legend,
                     "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                    for n, (expr, legend) in enumerate(queries)],
    }


def fleet_dashboard() -> dict:
    """The fleet dashboard: throughput, load, KV, latency percentiles, GPU power and
    interconnect throughput per host (and profile), from the monitor's rules."""
    return {
        "uid": FLEET_UID, "title": "gpuserve fleet", "tags": ["gpuserve", "sglang"],
        "schemaVersion": 39, "version": 1, "editable": True, "timezone": "utc",
        "refresh": "10s", "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [{"name": "datasource", "type": "datasource",
                                 "query": "prometheus", "current": {}}]},
        "annotations": {"list": []},
        "panels": [_panel(i, *p) for i, p in enumerate(FLEET_PANELS)],
    }


def fleet_dashboard_text() -> str:
    return json.dumps(fleet_dashboard(), indent=2, sort_keys=True) + "\n"


def dashboard_files() -> dict[str, str]:
    """File name -> JSON text of every dashboard built here (the upstream ones are
    fetched on the grafana host: :class:`GrafanaPlan` ``fetches``)."""
    return {FLEET_FILE: fleet_dashboard_text()}


def provisioning_files(prometheus_url: str) -> dict[str, str]:
    """Grafana's provisioning: the monitor's Prometheus as a data source, and a file
    provider loading the dashboards from disk (paths on the grafana host)."""
    datasource = {"apiVersion": 1, "datasources": [{
        "name": "gpuserve Prometheus", "uid": DATASOURCE_UID, "type": "prometheus",
        "access": "proxy", "url": prometheus_url, "isDefault": True, "editable": False}]}
    provider = {"apiVersion": 1, "providers": [{
        "name": "gpuserve", "folder": "gpuserve", "type": "file",
        "disableDeletion": True, "allowUiUpdates": False,
        "options": {"path": GRAFANA_DASHBOARDS}}]}
    return {f"{PROVISIONING}/datasources/gpuserve.yaml": json.dumps(datasource, indent=2),
            f"{PROVISIONING}/dashboards/gpuserve.yaml": json.dumps(provider, indent=2)}


#: Host data of a ``grafana`` group host (roles/grafana).
GRAFANA_DEFAULTS = {
    # sha256 of Grafana's apt signing key (https://apt.grafana.com/gpg.key, as
    # sha256sum prints it): required on a grafana host, so the key apt will trust for
    # Grafana's packages is the one the operator checked
    # accepts: str (64 hex digits) or None
    "grafana_keyring_sha256": None,
    # the apt version of the grafana package to pin; None: the newest
    # accepts: str (an apt version) or None
    "grafana_version": None,
    # Where the grafana host fetches the upstream dashboards (NVIDIA's DCGM dashboard,
    # SGLang's; gpuserve/data/monitor/dashboards.yaml) for an air-gapped host: a mirror
    # holding each at <mirror>/<repository>/<commit>/<path>, the raw URL's layout (an
    # https or trusted http URL, or file:// on the host). Each file is checked against
    # the catalog's sha256 before Grafana sees it. None: GitHub's raw files at the
    # pinned commits.
    # accepts: str (a URL) or None
    "grafana_dashboards_mirror": None,
}
GRAFANA_REPO = "https://apt.grafana.com"
GRAFANA_KEY_URL = f"{GRAFANA_REPO}/gpg.key"
GRAFANA_KEYRING = "/usr/share/keyrings/grafana.gpg"
GRAFANA_SOURCES = "/etc/apt/sources.list.d/grafana.sources"


@dataclass(frozen=True)
class GrafanaPlan:
    files: dict[str, str]  # path on the grafana host -> text
    keyring_sha256: str
    package: str  # grafana, or grafana=VERSION
    fetches: tuple[DashboardFetch, ...] = ()  # upstream dashboards, sha256-checked


def plan_grafana(data: dict, source: str, prometheus_url: str) -> GrafanaPlan:
    """The Grafana host's repository, package, provisioning and dashboards."""
    digest = data.get("grafana_keyring_sha256")
    if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest.lower()):
        raise InputError(source, "grafana_keyring_sha256", "required on a grafana host: the "
                         f"sha256 of {GRAFANA_KEY_URL} (64 hex digits), checked before apt "
                         "trusts it")
    version = data.get("grafana_version")
    if version not in (None, "") and (not isinstance(version, str) or not re.fullmatch(
            r"[0-9][A-Za-z0-9.+~:-]{0,63}", version)):
        raise InputError(source, "grafana_version", f"must be an apt version, got "
                         f"{version!r:.40}")
    mirror = mirrors.mirror_from(data.get("grafana_dashboards_mirror"),
                                 "grafana_dashboards_mirror", data.get("trusted_mirrors"),
                                 source)
    files = dict(provisioning_files(prometheus_url))
    for name, text in dashboard_files().items():
        files[f"{GRAFANA_DASHBOARDS}/{name}"] = text
    files[GRAFANA_SOURCES] = (f"Types: deb\nURIs: {GRAFANA_REPO}\nSuites: stable\n"
                              f"Components: main\nSigned-By: {GRAFANA_KEYRING}\n")
    return GrafanaPlan(files, digest.lower(), f"grafana={version}" if version else "grafana",
                       plan_fetches(GRAFANA_DASHBOARDS, mirror))
