"""Prepare-time plan of the gateway deploy (deploy/router.py): host data, workers, lock.

SGLang's gateway (``smg``, fleet.md) runs on a router host and spreads requests over
the SGLang servers of an inventory group (host data ``router_workers_group``). Its
worker list is smg's file-discovery manifest (``{"version": 1, "workers": [{"url":
...}]}``, fleet.md section 7), rendered here from the group: each worker's address
(``private_address``, or 127.0.0.1 for the router host itself), the port its profile
serves on, without the hosts marked ``router_drain``. smg rereads the file when it
changes, so adding, removing or draining a host is a file change, never a restart.

Everything that can be wrong with the input is an ``InputError`` naming the inventory
file and field, raised before any host changes, by the deploy and by ``gpuserve check``
alike (:func:`plan_router`). Pure apart from ``group_members`` (the inventory), so tests
drive it with plain dicts.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpuserve import safeload, versions
from gpuserve.errors import InputError
from gpuserve.fleet import disaggregation as disagg
from gpuserve.fleet.multinode import Member, place_node
from gpuserve.launch.interpreter import InterpreterChoice
from gpuserve.launch.lock_choice import PreflightError
from gpuserve.launch.locks import AppLock, app_locks
from gpuserve.launch.profiles import load_profile, profile_ref_problem
from gpuserve.launch.venvs import interpreter_suffix
from gpuserve.paths import TEMPLATES_DIR
from gpuserve.plans.serve import optional_str
from gpuserve.serve import install as sglang
from gpuserve.serve.render import exec_start, systemd_quote
from gpuserve.serve.secret import validate_secret
from gpuserve.serve.service import listen_host
from gpuserve.settings import settings

PACKAGE = "smg"

DEFAULTS = {
    # On the router host: the inventory group whose hosts serve SGLang behind the gateway
    # (deploy/router.py acts only on hosts that set it).
    # accepts: str (an inventory group) or None
    "router_workers_group": None,
    # The gateway's API key (secret, at least 16 characters): clients send it as a Bearer
    # token; smg also sends it to the workers, so a worker with sglang_api_key must have
    # the same one. A root-only file on the host, never on a command line.
    # accepts: str (16+ characters) or None
    "router_api_key": None,
    # where clients reach the gateway
    "router_listen_address": "0.0.0.0",
    "router_port": 30080,
    # smg's Prometheus /metrics listener (None: the gateway's listen address)
    # accepts: str (an IP address) or None
    "router_prometheus_address": None,
    "router_prometheus_port": 29000,
    # smg --policy
    "router_policy": "cache_aware",
    # smg's health checks of the workers (GET /health)
    "router_health_check_interval": 10,
    "router_health_check_timeout": 5,
    "router_health_failure_threshold": 3,
    "router_health_success_threshold": 2,
    # how long smg retries a worker that is not up yet (an engine still loading), and how often
    "router_worker_startup_timeout": 1800,
    "router_worker_startup_check_interval": 30,
    # seconds between smg's periodic rereads of the manifest (it also rereads on change)
    "router_discovery_interval": 10,
    # how long the deploy waits for the workers to show "ready" before it only warns
    "router_ready_timeout": 60,
    # smg release to install (a lock smg-<V>-py<XY>.json must exist); None: the newest
    # accepts: str or None
    "router_version": None,
    # a directory of smg locks generated with tools/gen_lock.py --package smg
    # accepts: str (a directory) or None
    "router_locks_dir": None,
    # The CPython that builds smg's venv (never replacing python3): auto, system, managed
    # or an absolute interpreter path, chosen as the SGLang venvs' is (docs/hosts.md); a
    # managed build comes from sglang_python_mirror (catalog: sglang_python_builds) and
    # is unpacked under router_home. None: the host's sglang_python.
    # accepts: str: auto, system, managed or an absolute path; or None
    "router_python": None,
    # the system account smg runs as, and the root of its venvs, locks and scripts
    "router_user": "smg",
    "router_home": "/opt/gpuserve-router",
    # pip index / find-links for smg (None: pip_index_url / pip_find_links, else PyPI)
    # accepts: str (a URL) or None
    "router_pip_index_url": None,
    # accepts: str (a URL or directory) or None
    "router_pip_find_links": None,
    # A rolling switch (pyinfra --serial deploy/serve.py across the workers group,
    # roles/router/rolling.py): at most this many workers out of the gateway at once
    "router_max_unavailable": 1,
    # seconds to wait for the gateway to drop a worker taken out (smg drains it for
    # drain_settle_secs, 5 s, after its next reread of the manifest)
    "router_drain_timeout": 120,
    # seconds to wait for the requests still running on a worker taken out to finish
    # before it restarts (SGLang GET /v1/loads); a server that reports no load at all
    # gets router_drain_grace seconds instead
    "router_idle_timeout": 600,
    "router_drain_grace": 30,
    # On a worker host: leave it out of the gateway's manifest (smg drains it: no new
    # requests, in-flight ones finish, then it is removed)
    "router_drain": False,
}

#: smg 1.13.0's --policy choices (``smg launch --help``)
POLICIES = ("random", "round_robin", "passthrough", "cache_aware", "power_of_two",
            "least_load", "manual", "consistent_hashing", "prefix_hash")

UNIT_NAME = "gpuserve-router.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
CONFIG_DIR = "/etc/gpuserve-router"
MANIFEST_PATH = f"{CONFIG_DIR}/workers.json"
KEY_PATH = f"{CONFIG_DIR}/api-key"
LAUNCHER = "smg_launch.py"
PROBE = "smg_probe.py"
TEMPLATES = TEMPLATES_DIR  # templates/ of the checkout, or gpuserve/templates installed


@dataclass(frozen=True)
class Worker:
    host: str
    url: str
    drained: bool = False
    role: str | None = None  # prefill or decode behind smg in PD mode (fleet/disaggregation.py)
    bootstrap_port: int | None = None  # a prefill worker's bootstrap server


@dataclass(frozen=True)
class RouterPlan:
    group: str
    workers: tuple[Worker, ...]
    lock: AppLock | None  # None in gpuserve check (the host's Python picks it)
    locks: tuple[AppLock, ...]
    user: str
    home: str
    index_url: str | None
    find_links: str | None
    trusted: tuple[str, ...]
    listen: str
    port: int
    prometheus: str
    prometheus_port: int
    ready_timeout: float
    args: tuple[str, ...]  # smg launch arguments (never the key)
    max_unavailable: int = 1
    drain_timeout: float = 120.0
    idle_timeout: float = 600.0
    drain_grace: float = 30.0
    api_key: str = field(repr=False, default="")
    warnings: tuple[str, ...] = ()
    interpreter: InterpreterChoice | None = None  # builds the venv (None: python3)
    python_wish: sglang.PythonWish | None = None  # router_python, mirror and catalog

    @property
    def python(self) -> str:
        """What runs ``-m venv`` on the host."""
        return self.interpreter.path if self.interpreter else "python3"

    @property
    def served(self) -> tuple[Worker, ...]:
        return tuple(w for w in self.workers if not w.drained)

    @property
    def venv(self) -> str:
        assert self.lock is not None
        return (f"{self.home}/venvs/{self.lock.package_name}-{self.lock.version}-"
                f"{self.lock.hash}{interpreter_suffix(self.python)}")

    @property
    def requirements(self) -> str:
        assert self.lock is not None
        return f"{self.home}/locks/{self.lock.name}-{self.lock.hash}.txt"

    @property
    def bin_dir(self) -> str:
        return f"{self.home}/bin"

    @property
    def state_dir(self) -> str:
        return f"{self.home}/cache"

    def argv(self) -> list[str]:
        return [f"{self.venv}/bin/python", f"{self.bin_dir}/{LAUNCHER}", *self.args]


def defaults() -> dict:
    return dict(DEFAULTS)


def is_router_host(host_data: dict) -> bool:
    return host_data.get("router_workers_group") not in (None, "")


def _int(data: dict, key: str, source: str, lo: int, hi: int) -> int:
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InputError(source, key, f"must be a whole number in [{lo}, {hi}], got "
                         f"{value!r:.40}")
    return value


def _ip(value: object, source: str, key: str) -> str:
    if not isinstance(value, str):
        raise InputError(source, key, f"must be an IP address string, got {value!r:.60}")
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise InputError(source, key, f"{value!r:.60} is not an IP address") from None


def _renamed(check: Callable, value: object, source: str, field: str, key: str):
    """The serve deploy's check of ``field`` applied to this deploy's ``key``."""
    try:
        return check(value, source)
    except InputError as exc:
        raise InputError(source, key, exc.message.replace(field, key)) from None


def _url(address: str, port: int) -> str:
    ip = ipaddress.ip_address(address)
    return f"http://[{ip}]:{port}" if ip.version == 6 else f"http://{ip}:{port}"


def worker_of(member: Member, *, router_host: str, router_ports: dict[str, int],
              api_key: str, source: str,
              group_members: Callable[[str], list[Member] | None]) -> Worker | None:
    """The manifest entry of one host of the workers group (None: a rank > 0 of a
    multi-node launch, which serves no HTTP)."""
    data = member.data
    where = f"(host {member.name})"
    profile_ref = data.get("profile")
    if not profile_ref or not isinstance(profile_ref, str):
        raise InputError(source, f"profile {where}", "required on every worker: the port "
                         "the gateway reaches it on is its profile's server.port")
    problem = profile_ref_problem(profile_ref)
    if problem:
        raise InputError(source, f"profile {where}", problem)
    profile = load_profile(profile_ref)
    if profile.parallel.nnodes > 1:
        group = data.get("sglang_nodes_group")
        placement = place_node(
            nnodes=profile.parallel.nnodes, dist_init_port=profile.parallel.dist_init_port,
            profile_source=str(profile.source), group=group,
            members=group_members(group) if isinstance(group, str) and group else None,
            host_name=member.name, source=source)
        if placement is not None and not placement.is_head:
            return None  # only node 0 serves HTTP (fleet.md section 9)
    port = profile.server.port
    worker_key = data.get("sglang_api_key")
    if worker_key not in (None, "") and worker_key != api_key:
        raise InputError(source, f"sglang_api_key {where}", "differs from the router's "
                         "router_api_key: smg sends its own key to the workers (as a Bearer "
                         "token), so this worker would refuse every request; give both the "
                         "same key, or the worker none (then keep it on a private network)")
    private = data.get("private_address")
    if private not in (None, ""):
        address = _ip(private, source, f"private_address {where}")
    elif member.name == router_host:
        address = "127.0.0.1"
    else:
        raise InputError(source, f"private_address {where}", f"required: the address the "
                         f"gateway on {router_host} reaches this worker on")
    listens, _ = listen_host(profile.server.host if profile.is_set("server.host") else None,
                             data.get("listen_address"), bool(worker_key),
                             str(profile.source), source, quiet=True)
    if not ipaddress.ip_address(listens).is_unspecified and listens != address:
        reach = ("only on 127.0.0.1 (no sglang_api_key or listen_address)"
                 if ipaddress.ip_address(listens).is_loopback else f"on {listens}")
        raise InputError(source, f"private_address {where}", f"the gateway would reach this "
                         f"worker at {address}, but its server listens {reach}; set "
                         f"listen_address {where} to {address} (or give it an sglang_api_key)")
    if member.name == router_host:
        for key, value in router_ports.items():
            if value == port:
                raise InputError(source, key, f"{value} is also the port of the SGLang "
                                 f"server on this host ({profile.source}: server.port); "
                                 "give the gateway another port")
    drain = data.get("router_drain", False)
    if not isinstance(drain, bool):
        raise InputError(source, f"router_drain {where}", f"must be true or false, got "
                         f"{drain!r:.40}")
    pd = disagg.gateway_role(member, group_members, source)
    return Worker(member.name, _url(address, port), drain, *(pd or (None, None)))


def plan_router(host_data: dict, source: str, *, host_name: str,
                group_members: Callable[[str], list[Member] | None],
                python: str | None = None, glibc: str | None = None,
                interpreter: InterpreterChoice | None = None) -> RouterPlan:
    """Validate the router host's data and its workers group; choose the smg lock for
    the ``python``/``glibc`` of the host's ``interpreter`` (gpuserve/launch/interpreter.py;
    unknown: no lock chosen, every candidate listed)."""
    data = settings(host_data, DEFAULTS)
    for key, value in data.items():  # before any message repeats a value
        safeload.check_value(value, source, key)
    group, members = _workers_group(data, source, group_members)
    api_key = validate_secret(data["router_api_key"], "router_api_key", source)
    if api_key is None:
        raise InputError(source, "router_api_key", "required: the gateway's API (requests, "
                         "and the worker admin routes) must not be open to anyone who reaches "
                         "it")
    listen, prometheus, port, prom_port, policy = _listeners(data, source)
    numbers = _numbers(data, source)
    user, home, index_url, find_links, trusted = _install_settings(data, host_data, source)
    wish = sglang.python_wish(host_data, source, "router_python")
    ports = {"router_port": port, "router_prometheus_port": prom_port}
    workers, warnings = _workers(members, group, host_name=host_name, ports=ports,
                                 api_key=api_key, source=source, group_members=group_members)
    candidates = _lock_candidates(data, source)
    lock = choose_app_lock(candidates, python, glibc, host_name) if python else None
    args = _smg_args(listen, port, prometheus, prom_port, policy, numbers)
    if any(w.role for w in workers):  # smg's PD router: prefill-decode pairs (the manifest)
        args.append("--pd-disaggregation")
    return RouterPlan(group=group, workers=tuple(workers), lock=lock,
                      locks=tuple(sorted(candidates, key=lambda lk: lk.name)), user=user,
                      home=home, index_url=index_url, find_links=find_links, trusted=trusted,
                      listen=listen, port=port, prometheus=prometheus,
                      prometheus_port=prom_port,
                      ready_timeout=float(numbers["router_ready_timeout"]), args=tuple(args),
                      max_unavailable=numbers["router_max_unavailable"],
                      drain_timeout=float(numbers["router_drain_timeout"]),
                      idle_timeout=float(numbers["router_idle_timeout"]),
                      drain_grace=float(numbers["router_drain_grace"]),
                      api_key=api_key, warnings=tuple(warnings), interpreter=interpreter,
                      python_wish=wish)


def _workers_group(data: dict, source: str,
                   group_members: Callable[[str], list[Member] | None]
                   ) -> tuple[str, list[Member]]:
    """Host data ``router_workers_group`` and its hosts (there must be some)."""
    group = data["router_workers_group"]
    if not isinstance(group, str) or not group:
        raise InputError(source, "router_workers_group", "required on a router host: the "
                         "inventory group whose hosts serve SGLang behind the gateway")
    members = group_members(group)
    if not members:
        raise InputError(source, "router_workers_group", f"no inventory group {group!r:.60} "
                         "with hosts: a gateway without workers serves nothing")
    return group, members


def _listeners(data: dict, source: str) -> tuple[str, str, int, int, str]:
    """Where the gateway and its metrics listen, and its policy."""
    listen = _ip(data["router_listen_address"], source, "router_listen_address")
    prometheus = _ip(data["router_prometheus_address"] or listen, source,
                     "router_prometheus_address")
    port = _int(data, "router_port", source, 1, 65535)
    prom_port = _int(data, "router_prometheus_port", source, 1, 65535)
    if prom_port == port:
        raise InputError(source, "router_prometheus_port", f"{prom_port} is also router_port")
    policy = data["router_policy"]
    if policy not in POLICIES:
        raise InputError(source, "router_policy", f"{policy!r:.40} is not one of smg's "
                         f"policies: {', '.join(POLICIES)}")
    return listen, prometheus, port, prom_port, policy


def _numbers(data: dict, source: str) -> dict[str, int]:
    """The health checks', discovery's and rolling switch's whole numbers, each in its
    range."""
    return {k: _int(data, k, source, lo, hi) for k, lo, hi in (
        ("router_health_check_interval", 1, 3600), ("router_health_check_timeout", 1, 600),
        ("router_health_failure_threshold", 1, 100), ("router_health_success_threshold", 1, 100),
        ("router_worker_startup_timeout", 1, 86_400),
        ("router_worker_startup_check_interval", 1, 3600),
        ("router_discovery_interval", 1, 3600), ("router_ready_timeout", 0, 3600),
        ("router_max_unavailable", 1, 10_000), ("router_drain_timeout", 1, 3600),
        ("router_idle_timeout", 0, 86_400), ("router_drain_grace", 0, 3600))}


def _install_settings(data: dict, host_data: dict, source: str
                      ) -> tuple[str, str, str | None, str | None, tuple[str, ...]]:
    """smg's account, home and pip URLs (the serve deploy's checks, under this deploy's
    keys; the pip URLs fall back to the host's own)."""
    user = _renamed(sglang.validate_user, data["router_user"], source, "sglang_user",
                    "router_user")
    home = _renamed(sglang.validate_home, data["router_home"], source, "sglang_home",
                    "router_home")
    index_url = optional_str(data, "router_pip_index_url", source) or optional_str(
        host_data, "pip_index_url", source)
    find_links = optional_str(data, "router_pip_find_links", source) or optional_str(
        host_data, "pip_find_links", source)
    trusted = sglang.validate_pip_urls(index_url, find_links,
                                       host_data.get("trusted_mirrors", []), source)
    return user, home, index_url, find_links, trusted


def _workers(members: list[Member], group: str, *, host_name: str, ports: dict[str, int],
             api_key: str, source: str,
             group_members: Callable[[str], list[Member] | None]
             ) -> tuple[list[Worker], list[str]]:
    """The manifest's workers (distinct addresses), and a warning when all are drained."""
    workers: list[Worker] = []
    seen: dict[str, str] = {}
    for member in members:
        worker = worker_of(member, router_host=host_name, router_ports=ports,
                           api_key=api_key, source=source, group_members=group_members)
        if worker is None:
            continue
        if worker.url in seen:
            raise InputError(source, f"private_address (host {member.name})",
                             f"{worker.url} is also host {seen[worker.url]}'s address: "
                             "two workers of one gateway need distinct addresses")
        seen[worker.url] = member.name
        workers.append(worker)
    errors, warnings = disagg.gateway_problems(
        [(w.role or "regular", w.drained) for w in workers], group)
    if errors:
        raise InputError(source, "router_workers_group", errors[0])
    if not any(not w.drained for w in workers):
        warnings.append(f"every worker of group {group} is drained (router_drain): the "
                        "gateway serves nothing until one comes back")
    return workers, warnings


def _lock_candidates(data: dict, source: str) -> list[AppLock]:
    """The smg locks of ``router_locks_dir`` (first) and the shipped ones, limited to
    ``router_version`` when set; InputError when none is left."""
    locks_dir = optional_str(data, "router_locks_dir", source)
    locks: dict[str, AppLock] = {}
    if locks_dir is not None:
        directory = Path(locks_dir).expanduser()
        if not directory.is_dir():
            raise InputError(source, "router_locks_dir", f"{locks_dir!r} is not a directory")
        locks.update((lk.name, lk) for lk in app_locks(PACKAGE, directory))
    for lk in app_locks(PACKAGE):
        locks.setdefault(lk.name, lk)
    pinned = optional_str(data, "router_version", source)
    candidates = [lk for lk in locks.values() if pinned is None or lk.version == pinned]
    if not candidates:
        raise InputError(source, "router_version" if pinned else "router_locks_dir",
                         f"no {PACKAGE} lock{' for ' + pinned if pinned else ''} (have: "
                         f"{', '.join(sorted(locks)) or 'none'})")
    return candidates


def _smg_args(listen: str, port: int, prometheus: str, prom_port: int, policy: str,
              numbers: dict[str, int]) -> list[str]:
    """``smg launch``'s arguments (never the key)."""
    return [
        "--host", listen, "--port", str(port),
        "--discovery-provider", "file", "--discovery-file", MANIFEST_PATH,
        "--discovery-check-interval-secs", str(numbers["router_discovery_interval"]),
        "--policy", policy,
        "--prometheus-host", prometheus, "--prometheus-port", str(prom_port),
        "--health-check-endpoint", "/health",
        "--health-check-interval-secs", str(numbers["router_health_check_interval"]),
        "--health-check-timeout-secs", str(numbers["router_health_check_timeout"]),
        "--health-failure-threshold", str(numbers["router_health_failure_threshold"]),
        "--health-success-threshold", str(numbers["router_health_success_threshold"]),
        "--worker-startup-timeout-secs", str(numbers["router_worker_startup_timeout"]),
        "--worker-startup-check-interval",
        str(numbers["router_worker_startup_check_interval"]),
        # no network from the hosts: never fetch a tokenizer from huggingface.co (fleet.md 8)
        "--disable-tokenizer-autoload",
    ]


def choose_app_lock(locks: list[AppLock], python: str, glibc: str | None,
                    host_name: str) -> AppLock:
    """The newest lock the host's Python and glibc can install."""
    usable = [lk for lk in locks if lk.supports(python, glibc) is None]
    if not usable:
        reasons = "; ".join(lk.supports(python, glibc) or "" for lk in locks)
        raise PreflightError(f"{host_name}: no {PACKAGE} lock fits this host ({reasons}); "
                             "nothing on the host was changed")
    return versions.newest(usable, key=lambda lk: lk.version)


def manifest_text(workers: tuple[Worker, ...] | list[Worker]) -> str:
    """smg's file-discovery manifest (fleet.md section 7): the workers not drained."""
    doc = {"version": 1, "workers": [_entry(w) for w in workers if not w.drained]}
    return json.dumps(doc, indent=1) + "\n"


def _entry(worker: Worker) -> dict:
    """One manifest entry: a PD worker's type and a prefill's bootstrap port too (smg's
    file discovery keys ``worker_type``, ``bootstrap_port``: docs/fleet.md)."""
    entry: dict = {"url": worker.url}
    if worker.role:
        entry["worker_type"] = worker.role
    if worker.bootstrap_port is not None:
        entry["bootstrap_port"] = worker.bootstrap_port
    return entry


def render_unit(plan: RouterPlan) -> str:
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True, autoescape=False)
    assert plan.lock is not None
    for word in (plan.group, plan.lock.name):
        systemd_quote(word)  # refuses control characters
    return env.get_template("smg-unit.service.j2").render(
        smg_version=plan.lock.version, lock_name=plan.lock.name, workers_group=plan.group,
        user=plan.user, state_dir=plan.state_dir, key_path=KEY_PATH,
        manifest_path=MANIFEST_PATH, discovery_interval=plan.args[
            plan.args.index("--discovery-check-interval-secs") + 1],
        exec_start=exec_start(plan.argv()), port=plan.port,
        prometheus_port=plan.prometheus_port)
