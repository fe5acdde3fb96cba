"""Scrape targets from the inventory: who exports what, where, with which labels.

Each GPU host (host data ``profile``) exports SGLang's metrics on the API's port and
address, DCGM's GPU metrics (9400) and node metrics (9100); each router host smg's
metrics (``router_prometheus_port``). Every target carries the labels host, group,
profile, model, sglang_version, gpu, so a series says which host and launch made it.
Written as Prometheus file-based service discovery documents (one per job), so a
changed inventory rewrites files and Prometheus rereads them without a restart.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuserve.errors import InputError
from gpuserve.fleet.status import ssh_address
from gpuserve.launch.dialect import target_version
from gpuserve.launch.profiles import Profile, load_profile
from gpuserve.measure.results import ResultRecord
from gpuserve.plans.router import DEFAULTS as ROUTER_DEFAULTS
from gpuserve.plans.router import is_router_host
from gpuserve.settings import settings

#: Host data of the exporters on a GPU host (roles/exporters).
EXPORTER_DEFAULTS = {
    # NVIDIA's dcgm-exporter (DCGM's DCGM_FI_* GPU metrics) on this GPU host; false: none
    # accepts: bool
    "dcgm_exporter": True,
    # the port dcgm-exporter listens on (its -a :PORT)
    # accepts: int (1..65535)
    "dcgm_exporter_port": 9400,
    # Debian's prometheus-node-exporter on this host (also reports the state of the
    # gpuserve, dcgm and Fabric Manager units); false: none
    # accepts: bool
    "node_exporter": True,
    # the port prometheus-node-exporter listens on
    # accepts: int (1..65535)
    "node_exporter_port": 9100,
    # the apt versions of NVIDIA's DCGM and of its exporter, pinned like the driver
    # (apt's "=VERSION"; an exporter release names the DCGM it pairs with); None: the
    # newest the CUDA repository has
    # accepts: str (an apt version, e.g. "1:4.6.0-1") or None
    "dcgm_version": None,
    # accepts: str (an apt version, e.g. "4.5.2-1") or None
    "dcgm_exporter_version": None,
    # the address the exporters listen on; None: listen_address when set, else all
    # addresses (a private network, or a firewall, keeps them from the world)
    # accepts: str (an IP address) or None
    "exporters_listen_address": None,
    # the address the monitor host scrapes this host at; None: the address the
    # exporters listen on when it is a specific one, else the host's ssh address
    # accepts: str (an IP address or host name) or None
    "monitor_scrape_address": None,
}

JOBS = ("sglang", "dcgm", "node", "smg")
LABELS = ("host", "group", "profile", "model", "sglang_version", "gpu")


@dataclass(frozen=True)
class Target:
    job: str
    address: str  # host:port
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class HostEntry:
    """One inventory host as the monitor plan sees it."""

    name: str
    data: dict
    group: str  # its first group (inventory order), "ungrouped" without one
    last_run: ResultRecord | None = None  # its last bench record on the controller
    running: str | None = None  # the profile it runs, by the last passing deploy's record
    removed: str | None = None  # when deploy/remove.py took its server off (no SGLang target)


@dataclass
class Targets:
    targets: list[Target] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def file_sd(self, job: str) -> str:
        """The file-based service discovery document of ``job`` (sorted, stable)."""
        doc = [{"targets": [t.address], "labels": t.labels}
               for t in sorted(self.targets, key=lambda t: (t.labels.get("host", ""),
                                                            t.address)) if t.job == job]
        return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def _port(data: dict, key: str, source: str) -> int:
    value = settings(data, ROUTER_DEFAULTS, EXPORTER_DEFAULTS)[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise InputError(source, key, f"must be a port in 1..65535, got {value!r:.40}")
    return value


def _switch(data: dict, key: str, source: str) -> bool:
    value = settings(data, EXPORTER_DEFAULTS)[key]
    if not isinstance(value, bool):
        raise InputError(source, key, f"must be true or false, got {value!r:.40}")
    return value


def _url_host(address: str) -> str:
    try:
        return f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    except ValueError:
        return address


def scrape_address(name: str, data: dict, source: str) -> str:
    """Where the monitor reaches host ``name``: ``monitor_scrape_address``, else a
    specific ``listen_address``, else the ssh address."""
    value = data.get("monitor_scrape_address")
    if value not in (None, ""):
        return ssh_address(name, {"ssh_hostname": value}, source)
    listen = data.get("listen_address")
    if isinstance(listen, str) and listen:
        try:
            ip = ipaddress.ip_address(listen)
        except ValueError:
            raise InputError(source, f"listen_address (host {name})",
                             f"{listen!r:.60} is not an IP address") from None
        if not ip.is_unspecified and not ip.is_loopback:
            return str(ip)
    return ssh_address(name, data, source)


def _gpu_label(run: ResultRecord | None) -> str:
    gpus = (run.context or {}).get("gpus") if run is not None else None
    name = gpus.get("name") if isinstance(gpus, dict) else None
    count = gpus.get("count") if isinstance(gpus, dict) else None
    if not name:
        return "unknown"
    return f"{count}x {name}" if isinstance(count, int) else str(name)


def host_labels(entry: HostEntry, profile: Profile | None) -> dict[str, str]:
    data = entry.data
    version = data.get("sglang_version") or (target_version(profile) if profile else "")
    model = (profile.model.served_name or profile.model.path) if profile else ""
    return {"host": entry.name, "group": entry.group,
            "profile": profile.name if profile else "", "model": str(model),
            "sglang_version": str(version), "gpu": _gpu_label(entry.last_run)}


def sglang_serves_remotely(data: dict) -> bool:
    """Whether the server listens beyond loopback (gpuserve/serve/service.listen_host's
    rule: listen_address, else the profile's host when an API key is set)."""
    listen = data.get("listen_address")
    if isinstance(listen, str) and listen:
        try:
            return not ipaddress.ip_address(listen).is_loopback
        except ValueError:
            return False
    return bool(data.get("sglang_api_key"))


def gpu_host_targets(entry: HostEntry, source: str, out: Targets,
                     profile_of: Callable[[str], Profile] = load_profile,
                     monitor_host: str | None = None) -> None:
    """The host's targets; the monitor host itself scrapes its own loopback server."""
    data = entry.data
    profile = running_profile(entry, source, out, profile_of)
    labels = host_labels(entry, profile)
    address = _url_host(scrape_address(entry.name, data, source))
    if entry.removed:
        out.warnings.append(f"{entry.name}: its server was removed at {entry.removed} "
                            "(deploy/remove.py): SGLang is not scraped until a serve deploy")
    elif data.get("sglang_metrics", True) is False:
        out.warnings.append(f"{entry.name}: sglang_metrics is off: SGLang's figures are "
                            "not scraped")
    elif entry.name == monitor_host and not sglang_serves_remotely(data):
        out.targets.append(Target("sglang", f"127.0.0.1:{profile.server.port}", labels))
    elif not sglang_serves_remotely(data):
        out.warnings.append(f"{entry.name}: SGLang listens on 127.0.0.1 only, so the "
                            "monitor cannot scrape it; set listen_address to a private "
                            "address (or sglang_api_key)")
    else:
        out.targets.append(Target("sglang", f"{address}:{profile.server.port}", labels))
    if _switch(data, "dcgm_exporter", source):
        # dcgm-exporter labels each series with its GPU index as ``gpu`` (and the model as
        # ``modelName``): a target label of that name would push it to ``exported_gpu``
        dcgm_labels = {k: v for k, v in labels.items() if k != "gpu"}
        out.targets.append(Target("dcgm", f"{address}:{_port(data, 'dcgm_exporter_port', source)}",
                                  dcgm_labels))
    if _switch(data, "node_exporter", source):
        out.targets.append(Target("node", f"{address}:{_port(data, 'node_exporter_port', source)}",
                                  labels))


def running_profile(entry: HostEntry, source: str, out: Targets,
                    profile_of: Callable[[str], Profile] = load_profile) -> Profile:
    """The profile the host runs (its labels and port), by the last passing deploy's
    record; the inventory's when none is recorded or the recorded one no longer loads."""
    desired = entry.data["profile"]
    if not entry.running or entry.running == desired:
        return profile_of(desired)
    try:
        profile = profile_of(entry.running)
    except InputError as exc:
        out.warnings.append(f"{entry.name}: runs {entry.running} by its records, which does "
                            f"not load ({str(exc)[:120]}); labelled as the inventory's {desired}")
        return profile_of(desired)
    out.warnings.append(f"{entry.name}: runs {entry.running} (the last passing deploy's "
                        f"record), the inventory names {desired}: labelled and scraped as "
                        f"{entry.running} until a deploy switches it ({source})")
    return profile


def router_targets(entry: HostEntry, source: str, out: Targets) -> None:
    data = entry.data
    listen = data.get("router_prometheus_address") or data.get(
        "router_listen_address", ROUTER_DEFAULTS["router_listen_address"])
    address = _url_host(scrape_address(entry.name, {**data, "listen_address": listen}, source))
    labels = {"host": entry.name, "group": entry.group, "profile": "", "model": "",
              "sglang_version": "", "gpu": ""}
    out.targets.append(Target("smg", f"{address}:{_port(data, 'router_prometheus_port', source)}",
                              labels))
    if not data.get("profile") and _switch(data, "node_exporter", source):
        out.targets.append(Target("node", f"{address}:{_port(data, 'node_exporter_port', source)}",
                                  labels))


def targets_of(entries: list[HostEntry], source: str,
               profile_of: Callable[[str], Profile] = load_profile,
               monitor_host: str | None = None) -> Targets:
    """Every scrape target of the inventory, and why a host exports less than it could
    (``monitor_host``: the host whose Prometheus these are)."""
    out = Targets()
    for entry in entries:
        if entry.data.get("profile"):
            gpu_host_targets(entry, source, out, profile_of, monitor_host)
        if is_router_host(entry.data):
            router_targets(entry, source, out)
    return out
