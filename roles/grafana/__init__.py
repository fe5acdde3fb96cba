"""Grafana from Grafana's own apt repository on a ``grafana`` host, provisioned with the
monitor's Prometheus and the dashboards: ours (gpuserve/monitor/dashboards.py) written,
the upstream ones fetched from their pinned sources and sha256-checked (upstream.py).

Why its repository: Grafana is not in Debian's archive. The signing key is fetched once
and checked against host data ``grafana_keyring_sha256`` before apt trusts it (as the
driver role checks NVIDIA's keyring). The lab validates the dashboard files only.
"""

from __future__ import annotations

import shlex

from pyinfra.api import QuoteString, StringCommand, deploy, operation
from pyinfra.operations import apt

from gpuserve.monitor.dashboards import (
    GRAFANA_DASHBOARDS,
    GRAFANA_DEFAULTS,
    GRAFANA_KEY_URL,
    GRAFANA_KEYRING,
    GRAFANA_SOURCES,
    GrafanaPlan,
)
from gpuserve.roles.base import managed
from gpuserve.roles.base.prefetch import Read
from gpuserve.roles.exporters import missing_packages, package_reads
from gpuserve.roles.grafana import upstream
from gpuserve.roles.service import activation_steps

DEFAULTS = GRAFANA_DEFAULTS
UNIT = "grafana-server.service"

__all__ = ["DEFAULTS", "configure_grafana", "reads"]


def reads(plan: GrafanaPlan) -> list[Read]:
    return [*package_reads([plan.package]), managed.read(GRAFANA_KEYRING),
            managed.read(GRAFANA_DASHBOARDS), *(managed.read(p) for p in plan.files),
            *upstream.reads(plan.fetches), managed.read_unit(UNIT)]


@operation()
def _keyring(sha256: str):
    """Fetch Grafana's key, refuse it unless its sha256 matches, dearmor it for apt."""
    q = shlex.quote
    yield StringCommand("sh", "-c", QuoteString(
        f"set -e; t=$(mktemp); curl -fsSL --proto =https {q(GRAFANA_KEY_URL)} -o \"$t\"; "
        f"echo {q(sha256 + '  ')}\"$t\" | sha256sum -c --quiet - || "
        "{ echo 'grafana key: sha256 differs from grafana_keyring_sha256' >&2; rm -f \"$t\"; "
        f"exit 1; }}; gpg --dearmor < \"$t\" > {q(GRAFANA_KEYRING)}.tmp && "
        f"mv {q(GRAFANA_KEYRING)}.tmp {q(GRAFANA_KEYRING)}; rm -f \"$t\""))


@deploy("Grafana")
def configure_grafana(plan: GrafanaPlan) -> None:
    managed.packages(name="Tools to fetch Grafana's key", packages=["curl", "gnupg",
                                                                    "ca-certificates"])
    if managed.state(GRAFANA_KEYRING).kind != "file":
        _keyring(name="Grafana's signing key (sha256-checked)", sha256=plan.keyring_sha256)
    managed.put(name="Grafana's apt source", dest=GRAFANA_SOURCES,
                         text=plan.files[GRAFANA_SOURCES], user="root", group="root",
                         mode="644")
    missing = missing_packages([plan.package])
    installed = apt.packages(name="Install Grafana", packages=missing, update=True) \
        if missing else None
    managed.directory(name="Dashboards directory", path=GRAFANA_DASHBOARDS, user="root",
                      group="root", mode="755")
    changed = [managed.put(name=f"Write {path}", dest=path, text=text, user="root",
                           group="root", mode="644")
               for path, text in plan.files.items() if path != GRAFANA_SOURCES]
    changed += [upstream.fetch(f) for f in plan.fetches]
    files_changed = installed is not None or any(op is not None for op in changed)
    steps = activation_steps(managed.unit_state(UNIT), files_changed, False)
    if steps:
        managed.systemctl(name="Activate Grafana", unit=UNIT, steps=tuple(steps))
