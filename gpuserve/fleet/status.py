"""``gpuserve fleet status``: where each host of an inventory stands, without SSH.

Pure logic: which URL reaches a gateway from the controller (:func:`gateway_url`), what
the gateway's answer says of each host, which record is the last one, and the JSON
document. The command (gpuserve/commands/fleet.py) loads the inventory, asks the
gateways and prints.

How: docs/fleet.md, "gpuserve.fleet.status: which address reaches the gateway"
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from gpuserve.errors import InputError
from gpuserve.fleet.rolling import GatewayWorker, normal_url
from gpuserve.measure.compare import chronological, run_dict
from gpuserve.measure.results import ResultRecord

#: What the gateway's answer says of a host (``view`` in the JSON; the table writes
#: them with spaces). ``unhealthy`` covers smg's ``not_ready``, ``failed`` and a
#: ``ready`` worker whose health checks fail; ``status`` keeps smg's own word.
VIEWS = ("ready", "draining", "pending", "unhealthy", "not_listed", "not_behind_gateway",
         "node_rank", "no_answer")
#: how the table writes them
VIEW_TEXT = {"not_listed": "not listed", "not_behind_gateway": "not behind a gateway",
             "node_rank": "node rank > 0", "no_answer": "no answer"}

#: A host name pyinfra could connect to (no scheme, path, user or port in it).
_HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,251}[A-Za-z0-9])?")
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


@dataclass(frozen=True)
class GatewayTarget:
    """One router host's gateway: where the controller asks it, and whom it should list."""

    router: str  # inventory host name of the router host
    group: str  # its workers group
    url: str  # base URL, without a trailing slash
    workers: tuple[tuple[str, str, bool], ...]  # (host, worker URL, router_drain)
    members: tuple[str, ...]  # every host of the group (ranks > 0 of a multi-node launch too)
    overridden: bool = False  # --gateway


@dataclass(frozen=True)
class GatewayAnswer:
    """What one gateway said: its workers, or why there is nothing to read."""

    target: GatewayTarget
    workers: tuple[GatewayWorker, ...] | None
    error: str | None = None

    @property
    def unknown_workers(self) -> tuple[str, ...]:
        """URLs the gateway lists that are no host of its workers group."""
        ours = {normal_url(url) for _, url, _ in self.target.workers}
        return tuple(w.url for w in self.workers or () if w.url not in ours)

    @property
    def ready(self) -> int:
        return sum(w.ready for w in self.workers or ())


@dataclass(frozen=True)
class WorkerView:
    """One gateway's view of one host."""

    router: str | None  # None: behind no gateway
    view: str  # one of VIEWS
    worker_url: str | None = None
    status: str | None = None  # smg's status word, when listed
    healthy: bool | None = None  # smg's is_healthy, when listed
    drained: bool = False  # host data router_drain
    note: str | None = None

    @property
    def text(self) -> str:
        return VIEW_TEXT.get(self.view, self.view)

    def to_dict(self) -> dict:
        return {"router": self.router, "view": self.view, "worker_url": self.worker_url,
                "status": self.status, "is_healthy": self.healthy,
                "router_drain": self.drained, "note": self.note}


@dataclass
class HostStatus:
    """One host's row."""

    host: str
    profile: str | None = None
    profile_file: str | None = None
    sglang_versions: tuple[str, ...] = ()  # newest first; one when host data pins it
    pinned: bool = False
    router_of: tuple[str, ...] = ()  # the groups this host is the gateway of
    plan_error: str | None = None
    views: list[WorkerView] = field(default_factory=list)
    results_dir: str | None = None
    last_run: ResultRecord | None = None
    records_error: str | None = None
    live: object | None = None  # gpuserve.monitor.query.LiveFigures, from the monitor
    running: object | None = None  # gpuserve.serve.running.Running, from the records
    role: str | None = None  # prefill or decode in a PD fleet (docs/disaggregation.md)

    @property
    def ok(self) -> bool:
        return self.plan_error is None and self.records_error is None


# ------------------------------------------------------------------------ addresses


def _url_host(address: str) -> str:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    return f"[{ip}]" if ip.version == 6 else str(ip)


def _is_loopback(address: str) -> bool:
    if address.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def ssh_address(name: str, data: dict, source: str) -> str:
    """The address pyinfra reaches host ``name`` on: ``ssh_hostname``, else the name
    (``@local``: 127.0.0.1). Another connector (``@docker/...``) has no address here."""
    value = data.get("ssh_hostname")
    key = f"ssh_hostname (host {name})"
    if value in (None, ""):
        if name == "@local":
            return "127.0.0.1"
        if name.startswith("@"):
            raise InputError(source, f"router_listen_address (host {name})", "the router "
                             "host is reached through a pyinfra connector, not an address: "
                             "pass --gateway URL")
        value, key = name, f"host name {name!r:.80}"
    if not isinstance(value, str):
        raise InputError(source, key, f"must be a host name or address, got {value!r:.60}")
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    if not _HOSTNAME.fullmatch(value):
        raise InputError(source, key, f"{value!r:.80} is not a host name or IP address")
    return value


def gateway_url(name: str, data: dict, listen: str, port: int, source: str) -> str:
    """The URL the controller reaches router host ``name``'s gateway at (docs/fleet.md)."""
    address = ipaddress.ip_address(listen)  # plan_router checked it
    ssh = ssh_address(name, data, source)
    if address.is_unspecified:
        host = ssh
    elif address.is_loopback:
        if not _is_loopback(ssh):
            raise InputError(source, f"router_listen_address (host {name})", f"the gateway "
                             f"listens on {address} only, which the controller cannot reach "
                             f"on {ssh}: pass --gateway URL (e.g. through ssh -L "
                             f"{port}:{_url_host(str(address))}:{port} {ssh})")
        host = str(address)
    else:
        host = str(address)
    return f"http://{_url_host(host)}:{port}"


def check_gateway_override(url: str, field_name: str = "--gateway") -> str:
    """``--gateway URL``: http(s)://host[:port], no credentials (the key comes from
    host data ``router_api_key``, never from a command line), no query. Returned without
    a trailing slash; ``/workers`` is appended to it."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError as exc:
        raise InputError(None, field_name, f"{url!r:.100}: {exc}") from None
    if parts.scheme not in ("http", "https") or not host:
        raise InputError(None, field_name, f"{url!r:.100} is not an http:// or https:// URL")
    if not _HOSTNAME.fullmatch(host):
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise InputError(None, field_name, f"{host!r:.80} is not a host name or IP "
                             "address") from None
    if parts.username is not None or parts.password is not None:
        raise InputError(None, field_name, "a URL with credentials: the key is read from "
                         "the router host's router_api_key, never from a command line")
    if parts.query or parts.fragment:
        raise InputError(None, field_name, f"{url!r:.100}: no query or fragment, please "
                         "(the gateway's base URL; /workers is added)")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise InputError(None, field_name, f"{url!r:.100}: {exc}") from None
    return url.rstrip("/")


# ------------------------------------------------------------------------ the views


def _listed_view(router: str, worker: GatewayWorker, drained: bool) -> WorkerView:
    if worker.status == "draining":
        view = "draining"
        note = None if drained else ("the inventory serves it (router_drain unset): a "
                                     "rolling switch in progress, or the gateway's manifest "
                                     "is older than the inventory (deploy/router.py)")
    elif worker.ready:
        view = "ready"
        note = ("router_drain is set but the gateway still serves it: the manifest is "
                "older than the inventory (deploy/router.py)") if drained else None
    elif worker.status == "pending":
        view, note = "pending", "registered, not yet health-checked"
    else:
        view = "unhealthy"
        note = (f"smg status {worker.status}, is_healthy "
                f"{'true' if worker.healthy else 'false'}")
    return WorkerView(router, view, worker.url, worker.status, worker.healthy, drained, note)


def views_of(host: str, answers: Sequence[GatewayAnswer]) -> list[WorkerView]:
    """Each gateway's view of ``host`` (one per gateway whose group holds it); a host in
    no workers group: one ``not_behind_gateway`` view."""
    out: list[WorkerView] = []
    for answer in answers:
        target = answer.target
        if host not in target.members:
            continue
        entry = next(((url, drained) for h, url, drained in target.workers if h == host),
                     None)
        if entry is None:  # plan_router lists only node 0 of a multi-node launch
            out.append(WorkerView(target.router, "node_rank", note="a rank > 0 of a "
                                  "multi-node launch: node 0 serves it behind the gateway"))
            continue
        url, drained = normal_url(entry[0]), entry[1]
        if answer.workers is None:
            out.append(WorkerView(target.router, "no_answer", url, drained=drained,
                                  note=answer.error))
            continue
        listed = next((w for w in answer.workers if w.url == url), None)
        if listed is not None:
            out.append(_listed_view(target.router, listed, drained))
        elif drained:
            out.append(WorkerView(target.router, "not_listed", url, drained=True,
                                  note="router_drain: left out of the manifest"))
        else:
            out.append(WorkerView(target.router, "not_listed", url, note=(
                "the gateway has not registered it: its engine is down or still loading, "
                "or the manifest on the router host is older than the inventory")))
    if not out:
        out.append(WorkerView(None, "not_behind_gateway"))
    return out


# ------------------------------------------------------------------------ records


def last_run(records: Iterable[ResultRecord], host: str) -> ResultRecord | None:
    """The latest throughput run of ``host``: its last bench record, else its last smoke
    completion (one request), in compare's order (records without a timestamp oldest)."""
    mine = [r for r in records if r.host in (None, host)]
    for kind in ("bench", "smoke"):
        runs = chronological(r for r in mine if r.kind == kind)
        if runs:
            return runs[-1]
    return None


# ------------------------------------------------------------------------ output


def exit_code(hosts: Sequence[HostStatus], answers: Sequence[GatewayAnswer]) -> int:
    """0: every gateway answered and every host's data and records read; 1: a gateway
    gave no usable answer, or a host fails the deploys' checks or has unreadable
    records. The workers' states are the report, never the exit status."""
    return 0 if all(h.ok for h in hosts) and all(a.error is None for a in answers) else 1


def gateway_dict(answer: GatewayAnswer) -> dict:
    t = answer.target
    return {"router": t.router, "group": t.group, "url": t.url, "overridden": t.overridden,
            "answered": answer.workers is not None, "error": answer.error,
            "listed": None if answer.workers is None else len(answer.workers),
            "ready": None if answer.workers is None else answer.ready,
            "unknown_workers": list(answer.unknown_workers)}


def host_dict(h: HostStatus) -> dict:
    return {"host": h.host, "role": h.role, "profile": h.profile, "profile_file": h.profile_file,
            "sglang_versions": list(h.sglang_versions), "sglang_pinned": h.pinned,
            "router_of": list(h.router_of), "plan_error": h.plan_error,
            "gateway": [v.to_dict() for v in h.views], "results_dir": h.results_dir,
            "last_run": None if h.last_run is None else run_dict(h.last_run),
            "records_error": h.records_error,
            "live": None if h.live is None else dict(h.live.values),
            "running": None if h.running is None else h.running.to_dict()}


def status_dict(inventory: str, hosts: Sequence[HostStatus],
                answers: Sequence[GatewayAnswer]) -> dict:
    return {"inventory": inventory, "ok": exit_code(hosts, answers) == 0,
            "gateways": [gateway_dict(a) for a in answers],
            "hosts": [host_dict(h) for h in hosts]}
