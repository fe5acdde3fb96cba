"""``gpuserve check INVENTORY``: the deploys' prepare-time checks, for every host of a
pyinfra inventory, without connecting to any host.

Why: pyinfra connects to every host before it loads a deploy file, so a typo in a
profile or in host data is otherwise reported after SSH to the whole fleet. A lint, not a
substitute: the deploys keep their own checks. Unlike the rest of ``gpuserve/`` it
imports pyinfra's CLI loader (lazily): loading inventories as the deploys do is its point.

How: docs/check.md, "gpuserve.commands.check: what it runs and what it leaves to the host"
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpuserve import safeload
from gpuserve import versions as pep440
from gpuserve.errors import GpuserveError, InputError
from gpuserve.fleet.multinode import Member
from gpuserve.table import table
from gpuserve.terminal import escaped_key, non_ascii_note, printable

DEPLOYS = ("serve", "host", "router", "hypervisor", "monitor")

#: Said in every report: what needs the host itself and was therefore not judged.
NOT_CHECKED = {
    "serve": ["driver, Python and glibc (the lock is judged against every candidate "
              "instead)", "free disk", "CUDA toolkit major", "checkpoint memory fit (the "
              "model record's plan calibrated by the host's last recorded start is, when "
              "there is one)",
              "doctor rules on the host's facts", "/etc/gpuserve/host.json flags",
              "service account against the host's users and groups"],
    "host": ["CPU vendor and ACPI tables (the IOMMU kernel parameters)", "boot loader",
             "Secure Boot", "running kernel and installed packages"],
    "router": ["the router host's Python and glibc (they pick the smg lock)",
               "the service account against the host's users and groups",
               "whether the workers are up and reachable from the router host"],
    "hypervisor": ["the host's sysfs (GPU addresses, vfio ids and the MMIO window "
                   "default to what it shows)", "the guest's qm/pct config",
                   "CPU vendor (the IOMMU kernel parameters)"],
    "monitor": ["the host's prometheus, node exporter, DCGM and Grafana packages and their "
                "versions in its repositories", "the Grafana key's sha256 against the key "
                "the host fetches", "whether the monitor host reaches its targets"],
}


@dataclass
class Result:
    """One host and one deploy: ``ok`` with a summary, or the error that stops it."""

    host: str
    deploy: str
    ok: bool
    summary: str = ""
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    details: dict = field(default_factory=dict)
    # how this deploy's path is proven on the host's distribution (gpuserve/host/proven.py)
    proven: str = ""


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "check",
        help="run the deploys' prepare-time checks for an inventory, without connecting",
        description="Load a pyinfra inventory (group data and --data applied as pyinfra "
        "does) and run the prepare-time checks of the deploys each host is for, "
        "connecting to none: deploy/serve.py and deploy/host.py for GPU hosts, "
        "deploy/router.py for gateway hosts (router_workers_group), deploy/hypervisor.py "
        "for Proxmox hosts (proxmox_vmid or proxmox_ctid), deploy/monitor.py for the "
        "monitor and grafana groups' hosts (and, when the inventory has either group, for "
        "its GPU and gateway hosts' exporters). Exit 0: all pass; 1: a host "
        "fails; 2: bad usage or an inventory that cannot be loaded.",
    )
    parser.add_argument("inventory", help="pyinfra inventory file (e.g. inventory/gpu.py)")
    parser.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                        help="override host data, as pyinfra's --data (repeatable)")
    parser.add_argument("--group-data", dest="group_data", action="append", default=[],
                        metavar="PATH", help="extra group data, as pyinfra's --group-data")
    parser.add_argument("--deploy", choices=(*DEPLOYS, "all"), default="all",
                        help="which deploy's checks (default: all that apply to each host)")
    parser.add_argument("--limit", action="append", default=[], metavar="GROUP|HOST",
                        help="only these groups or hosts (glob patterns on host names), "
                        "as pyinfra's --limit (repeatable)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    overrides = parse_data(args.data)
    hosts, groups = load_hosts(args.inventory, overrides, args.group_data)
    hosts = limit_hosts(hosts, groups, args.limit, args.inventory)
    deploys = DEPLOYS if args.deploy == "all" else (args.deploy,)
    monitored = args.deploy == "monitor" or any(g in groups for g in MONITOR_GROUPS)
    all_hosts = list(hosts)
    results = [check_host(name, data, args.inventory, deploy, groups, all_hosts)
               for name, data in hosts for deploy in deploys
               if deploy in deploys_for(data, groups_of(name, groups), monitored)]
    if not results:  # --deploy router on an inventory without a router host, say
        results = [Result(hosts[0][0], deploys[0], ok=False, error=f"{args.inventory}: "
                          f"no host of this inventory is for deploy/{deploys[0]}.py "
                          f"({KIND_KEYS[deploys[0]]})")]
    ok = all(r.ok for r in results)
    # say what a deploy's checks skip only when they ran
    deploys = tuple(d for d in deploys if any(r.deploy == d for r in results))
    if args.json:
        print(json.dumps({
            "inventory": args.inventory, "ok": ok, "deploys": list(deploys),
            "not_checked": {d: NOT_CHECKED[d] for d in deploys},
            "results": [asdict(r) for r in results],
        }, indent=2))
    else:
        print(format_results(results, deploys))
    return 0 if ok else 1


#: what makes a host one for each deploy (named when no host of an inventory is)
KIND_KEYS = {"serve": "a GPU host: profile, or no gateway or hypervisor key",
             "host": "a GPU host: profile, or no gateway or hypervisor key",
             "router": "a gateway host sets router_workers_group",
             "hypervisor": "a Proxmox host sets proxmox_vmid or proxmox_ctid",
             "monitor": "a host of the monitor or grafana group, a GPU host with a profile "
                        "or a gateway host"}

#: the inventory groups deploy/monitor.py gives Prometheus and Grafana
MONITOR_GROUPS = ("monitor", "grafana")


def groups_of(name: str, groups: dict[str, list[Member]]) -> set[str]:
    """The inventory groups host ``name`` is in."""
    return {g for g, members in groups.items() if any(m.name == name for m in members)}


def deploys_for(data: dict, groups: set[str] | frozenset[str] = frozenset(),
                monitored: bool = False) -> tuple[str, ...]:
    """The deploys a host is for, by its data and ``groups``: a Proxmox host
    (``proxmox_vmid`` or ``proxmox_ctid``) gets deploy/hypervisor.py; a gateway host
    (``router_workers_group``) deploy/router.py, and also the GPU deploys when it serves
    a ``profile`` itself; a host of the monitor or grafana group without a profile only
    deploy/monitor.py; every other host is a GPU host (serve and host). deploy/monitor.py
    also for GPU and gateway hosts when ``monitored`` (the inventory has a monitor or
    grafana group, or it was asked for). Why: a gateway, hypervisor or monitor host
    checked as a GPU host never passed."""
    from gpuserve.monitor.host_plan import applies

    in_monitor = any(g in groups for g in MONITOR_GROUPS)
    monitor = ("monitor",) if in_monitor or (monitored and applies(data, groups)) else ()
    hypervisor = data.get("proxmox_vmid") is not None or data.get("proxmox_ctid") is not None
    if hypervisor:
        return ("hypervisor", *monitor)
    router = _is_router_host(data)
    gpu = (not router and not in_monitor) or data.get("profile") is not None
    return (*(("serve", "host") if gpu else ()), *(("router",) if router else ()), *monitor)


def limit_hosts(hosts: list[tuple[str, dict]], groups: dict[str, list[Member]],
                limits: list[str], inventory: str) -> list[tuple[str, dict]]:
    """The hosts ``--limit`` keeps, as pyinfra's ``--limit``: a group name takes its
    members, anything else is a glob on host names; a limit matching nothing is an
    error (pyinfra also stops when no host remains)."""
    import fnmatch

    if not limits:
        return hosts
    keep: set[str] = set()
    for limit in limits:
        found = ({m.name for m in groups[limit]} if limit in groups
                 else {name for name, _ in hosts if fnmatch.fnmatchcase(name, limit)})
        if not found:
            raise InputError("--limit", limit[:80], f"no group or host of {inventory} "
                             f"matches (groups: {', '.join(sorted(groups)) or 'none'})")
        keep |= found
    return [(name, data) for name, data in hosts if name in keep]


def parse_data(items: list[str]) -> dict:
    """``--data k=v`` like pyinfra's CLI: values through pyinfra's own ``parse_cli_arg``
    (true/false, integers, JSON, else the string); a later key wins."""
    from gpuserve import safeload
    from gpuserve.facts.compat import parse_cli_value

    data: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError("--data", item[:80], "must be KEY=VALUE")
        data[key] = value
    parsed = {}
    for key, value in data.items():
        # parse_cli_arg tries json.loads: "[[[[..." 3000 deep was a RecursionError
        # traceback; bounded like every JSON document (gpuserve/safeload.py)
        if safeload.json_depth_exceeds(value, safeload.CONFIG.max_depth) is not None:
            raise InputError("--data", key[:80], "nested too deeply (more than "
                             f"{safeload.CONFIG.max_depth} levels)")
        try:
            parsed[key] = parse_cli_value(value)
        except (RecursionError, ValueError) as exc:
            raise InputError("--data", key[:80], f"cannot be read: {exc}"[:200]) from None
    return parsed


def load_hosts(inventory: str, overrides: dict, group_data: list[str] | None = None,
               ) -> tuple[list[tuple[str, dict]], dict[str, list[Member]]]:
    """(name, host data) of every host, and every group's members in inventory order
    (for multi-node profiles), loaded by pyinfra's CLI loader, connecting to none. Any
    failure to load is an ``InputError`` naming the file."""
    if not Path(inventory).exists():
        # pyinfra would take it for a host name (and resolve it); a lint wants a file
        raise InputError(inventory, None, "no such inventory file")
    # pyinfra reads these whole and runs them: a FIFO would hang it, /dev/zero fill memory
    safeload.regular_file(inventory, max_bytes=safeload.CONFIG.max_bytes)
    for path in group_data or []:
        if not Path(path).exists():
            raise InputError(path, "--group-data", "no such file or directory")
        # a group data file, or a directory of them (as pyinfra's --group-data)
        modules = sorted(Path(path).glob("*.py")) if Path(path).is_dir() else [path]
        for module in modules:
            safeload.regular_file(module, "--group-data", safeload.CONFIG.max_bytes)
    from gpuserve.facts.compat import load_inventory

    cwd = os.getcwd()
    if cwd not in sys.path:  # as pyinfra's CLI does, for inventories importing local code
        sys.path.append(cwd)
    try:
        loaded = load_inventory(
            inventory, overrides, cwd, group_data,
            check=lambda: validate_groups(inventory, _groups_of(inventory)))
        hosts = [(h.name, h.data.dict()) for h in loaded]
        groups = {g: [Member(h.name, h.data.dict()) for h in members]
                  for g, members in loaded.groups.items()}
    except GpuserveError:
        raise
    except SystemExit as exc:
        # sys.exit(0) in an inventory printed nothing and exited 0: "every host passed"
        raise _exit_error(inventory, exc) from None
    except Exception as exc:  # noqa: BLE001 - any error in user code names its file
        raise _load_error(inventory, exc) from None
    if not hosts:
        raise InputError(inventory, None, "the inventory has no hosts")
    return hosts, groups


def _groups_of(inventory: str) -> dict:
    """The inventory file's groups as pyinfra's CLI reads them (its own reader)."""
    from gpuserve.facts.compat import inventory_groups

    return inventory_groups(inventory)


def validate_groups(inventory: str, groups: dict) -> None:
    """Refuse what pyinfra's loader turns into a bare TypeError or silently drops.

    Why: a host whose data is not a dict (``("gpu1", 42)``) surfaced as "could not be
    loaded: 'int' object is not iterable", naming neither host nor group; the same host
    twice in one group kept only one entry's data without a word (the other entry's
    profile was never checked). Each problem is an ``InputError`` naming the inventory
    file and ``GROUP[INDEX]``.
    """
    for group, members in groups.items():
        hosts, data = members if isinstance(members, tuple) else (members, {})
        if isinstance(members, tuple) and (len(members) != 2 or not isinstance(data, dict)):
            raise InputError(inventory, group, "a group given as a tuple must be "
                             "(list of hosts, dict of group data)")
        seen: dict[str, int] = {}
        for index, item in enumerate(hosts):
            where = f"{group}[{index}]"
            name, host_data = item if isinstance(item, tuple) and len(item) == 2 else (
                item, {})
            if isinstance(item, tuple) and len(item) != 2:
                raise InputError(inventory, where, f"a host entry is a name or (name, "
                                 f"data), got a tuple of {len(item)} items")
            if not isinstance(name, str) or not name:
                raise InputError(inventory, where, f"a host name must be a non-empty "
                                 f"string, got {type(name).__name__}")
            if not isinstance(host_data, dict):
                raise InputError(inventory, where, f"host {name!r:.80}: host data must be a "
                                 f"dict of KEY: value, got {type(host_data).__name__}")
            for key in host_data:
                if not isinstance(key, str):
                    raise InputError(inventory, where, f"host {name!r:.80}: host-data keys "
                                     f"must be strings, got {type(key).__name__}")
            if name in seen:
                raise InputError(inventory, where, f"host {name!r:.80} is listed again "
                                 f"(first at {group}[{seen[name]}]); pyinfra would keep one "
                                 "entry's data only: merge them into one entry")
            seen[name] = index


def misspelt_keys(data: dict, source: str) -> None:
    """Refuse a host-data key that is no key of gpuserve or of pyinfra's connectors but
    is a near miss of one of gpuserve's (``sglang_verison``): the deploys ignore keys they
    do not document, so a typo silently takes the default. Keys far from every known
    one are the user's own data and stay allowed."""
    import difflib

    from gpuserve.facts.compat import known_connector_keys
    from gpuserve.host.defaults import PROXMOX
    from gpuserve.monitor.dashboards import GRAFANA_DEFAULTS
    from gpuserve.monitor.live_judge import LIVE_DEFAULTS
    from gpuserve.monitor.plan import MONITOR_DEFAULTS
    from gpuserve.monitor.targets import EXPORTER_DEFAULTS
    from gpuserve.plans.host import defaults as host_defaults
    from gpuserve.plans.router import defaults as router_defaults
    from gpuserve.plans.serve import defaults as serve_defaults

    ours = sorted({*serve_defaults(), *host_defaults(), *router_defaults(), *PROXMOX,
                   *EXPORTER_DEFAULTS, *MONITOR_DEFAULTS, *GRAFANA_DEFAULTS, *LIVE_DEFAULTS})
    known = set(ours) | known_connector_keys()
    for key in sorted(k for k in data if isinstance(k, str)):
        if key in known or key.startswith("_"):
            continue
        near = difflib.get_close_matches(key, ours, n=1, cutoff=0.85)
        if near:
            raise InputError(source, escaped_key(key), f"unknown host-data key"
                             f"{non_ascii_note(key)}; did you mean {near[0]}? "
                             "(the deploys ignore unknown keys, so this one would take "
                             "no effect)")


def _exit_error(inventory: str, exc: SystemExit) -> InputError:
    """An inventory (or a group data file, or code they import) called ``sys.exit``:
    name the inventory, and where it exited when that is another file."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where, line = (tb.tb_frame.f_code.co_filename, tb.tb_lineno) if tb else (inventory, None)
    same = Path(where).resolve() == Path(inventory).resolve()
    also = "" if same else f" (in {where}:{line})"
    return InputError(inventory, None, f"could not be loaded: it raised SystemExit"
                      f"({exc.code!r:.40}) while loading{also}; nothing was checked",
                      line if same else None)


def _load_error(inventory: str, exc: Exception) -> InputError:
    """pyinfra wraps an error raised by an inventory or group data file (lab.py's
    LabNotRunning) in UnexpectedExternalError; unwrap it to one line naming the file."""
    if isinstance(exc, SyntaxError) and exc.filename:  # the inventory or a group data file
        return InputError(exc.filename, None, f"could not be loaded: {exc.msg}", exc.lineno)
    inner = getattr(exc, "exception", None)
    if isinstance(inner, BaseException):
        where = getattr(exc, "filename", None) or inventory
        return InputError(where, None, f"could not be loaded: {type(inner).__name__}: "
                                       f"{inner}")
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    return InputError(inventory, None, f"could not be loaded: {message}")


def check_host(name: str, data: dict, source: str, deploy: str,
               groups: dict[str, list[Member]] | None = None,
               hosts: list[tuple[str, dict]] | None = None) -> Result:
    """One host, one deploy; a GpuserveError is the host's failure, not the command's.
    ``hosts``: every host of the inventory (the monitor deploy plans from all of them)."""
    checker: Callable[[str, dict, str], Result] = (
        functools.partial(check_serve, groups=groups or {}) if deploy == "serve"
        else functools.partial(check_router, groups=groups or {}) if deploy == "router"
        else check_hypervisor if deploy == "hypervisor"
        else functools.partial(check_monitor, groups=groups or {},
                               hosts=hosts or [(name, data)]) if deploy == "monitor"
        else check_host_deploy)
    try:
        misspelt_keys(data, source)
        result = checker(name, data, source)
        check_ssh_key(data, source)  # after the deploy's own refusal, which says more
    except GpuserveError as exc:
        result = Result(name, deploy, ok=False, error=str(exc))
    result.proven = proven_for(data, deploy)
    return result


def proven_for(data: dict, deploy: str) -> str:
    """How the deploy's path is proven on the distribution host data names
    (``host_distribution``), from docs/hosts.md's matrix as data; "" when it names none
    or the deploy has no distribution path (hypervisor, monitor)."""
    from gpuserve.host.proven import proven, proven_line

    path = {"host": "host", "serve": "serve", "router": "gateway"}.get(deploy)
    distro = data.get("host_distribution")
    if path is None or not isinstance(distro, str) or proven(distro, path) is None:
        return ""
    return proven_line(distro, path)


def check_ssh_key(data: dict, source: str, cwd: str | None = None) -> None:
    """Refuse host data ``ssh_key`` naming a file that is not there or that others may
    read: pyinfra finds out only when it connects (a greenlet dump for a missing key),
    and OpenSSH refuses a private key others can read. The path is resolved as pyinfra
    does: ``~`` expanded, else relative to the working directory."""
    import stat

    key = data.get("ssh_key")
    if key in (None, ""):
        return
    if not isinstance(key, str):
        raise InputError(source, "ssh_key", f"must be a file name, got {type(key).__name__}")
    path = Path(key).expanduser()
    if not path.is_absolute():
        path = Path(cwd or os.getcwd()) / path
    if not path.is_file():
        raise InputError(source, "ssh_key", f"no such file: {str(path)[:200]} (write the "
                         "path of the private key, or remove ssh_key to use the agent)")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o004:
        raise InputError(source, "ssh_key", f"{str(path)[:200]} is readable by every user "
                         f"(mode {mode:04o}); ssh refuses such a key: chmod 600 it")


def check_monitor(name: str, data: dict, source: str,
                  groups: dict[str, list[Member]] | None = None,
                  hosts: list[tuple[str, dict]] | None = None) -> Result:
    """deploy/monitor.py's plans for this host (gpuserve.monitor.host_plan, the code the
    deploy runs): exporters, the monitor group's Prometheus, the grafana group's
    Grafana."""
    from gpuserve.monitor.host_plan import MONITOR_GROUP, plan_monitor_host
    from gpuserve.monitor.records import Recorded, recorded
    from gpuserve.monitor.targets import HostEntry

    groups = groups or {}
    mine = groups_of(name, groups)
    entries = []
    for other, other_data in hosts or [(name, data)]:
        first = [g for g in groups if g not in ("all", MONITOR_GROUP)
                 and any(m.name == other for m in groups[g])]
        rec = recorded(other, other_data) if other_data.get("profile") else Recorded()
        entries.append(HostEntry(other, other_data, first[0] if first else "ungrouped",
                                 rec.run, rec.running.profile if rec.running else None,
                                 rec.removed))
    monitor_hosts = [(m.name, m.data) for m in groups.get(MONITOR_GROUP, [])]
    plan = plan_monitor_host(name, data, mine, entries if MONITOR_GROUP in mine else [],
                             monitor_hosts, source)
    parts = []
    if plan.exporters is not None:
        kinds = [k for k, on in (("node", plan.exporters.node), ("DCGM", plan.exporters.dcgm))
                 if on]
        parts.append(f"exporters: {', '.join(kinds) or 'none (both off)'}")
    if plan.monitor is not None:
        parts.append(f"Prometheus for {_count(len(entries), 'host')}, every "
                     f"{plan.monitor.interval} s"
                     + (", Alertmanager" if plan.monitor.alertmanager else ""))
    if plan.grafana is not None:
        parts.append(f"Grafana ({plan.grafana.package})")
    warnings = [*(plan.exporters.warnings if plan.exporters else ()),
                *(plan.monitor.warnings if plan.monitor else ())]
    return Result(name, "monitor", ok=True, summary="; ".join(parts) or "nothing to do",
                  warnings=warnings, details={"groups": sorted(mine)})


def unknown_runtime(name: str, python: str | None = None):
    """A host of which nothing is known (or only the Python of the lock it picked)."""
    from gpuserve.launch.lock_choice import HostRuntime

    return HostRuntime(name=name, python=python, glibc=None, driver=None,
                       cuda_toolkit=None, free_bytes=None, gpus=0)


def check_serve(name: str, data: dict, source: str,
                groups: dict[str, list[Member]] | None = None) -> Result:
    """deploy/serve.py's plan_serve with host facts unknown, then once per other lock a
    host could pick (as if it had picked it)."""
    from gpuserve.launch.catalog import available_versions
    from gpuserve.launch.lock_choice import PreflightError, choose_lock
    from gpuserve.plans.serve import HostReads, plan_serve, read_input

    inputs = read_input(data, source, name, (groups or {}).get)  # as the deploy reads it
    plan = plan_serve(inputs, HostReads(runtime=lambda home: unknown_runtime(name)))
    profile, pinned = inputs.profile, inputs.settings.pinned
    versions = profile.sglang_versions or available_versions()
    candidates = []
    for lock in inputs.locks:
        try:
            choose_lock([lock], unknown_runtime(name, lock.python), versions=versions,
                        pinned=pinned, profile=profile.name)
        except PreflightError:
            continue  # the profile or sglang_version rules it out on every host
        candidates.append(lock)
    candidates = reachable(candidates)
    warnings = list(plan.preflight.warnings if plan.preflight else ())
    verdicts = []
    for lock in sorted(candidates, key=lambda lk: (_release(lk.sglang), lk.name), reverse=True):
        problem = None
        if lock.name != plan.lock.name:
            try:
                pinned_input = dataclasses.replace(inputs, settings=dataclasses.replace(
                    inputs.settings, pinned=lock.sglang))
                plan_serve(pinned_input, HostReads(
                    runtime=lambda home, lk=lock: unknown_runtime(name, lk.python)))
            except GpuserveError as exc:
                problem = str(exc)
                warnings.append(f"a host that picks lock {lock.name} (Python {lock.python}, "
                                f"driver >= {lock.driver_min}) would be refused: {problem}")
        verdicts.append({"lock": lock.name, "ok": problem is None, "problem": problem})
    interpreter = interpreter_report(name, data, source, [
        lk for lk in candidates if any(v["lock"] == lk.name and v["ok"] for v in verdicts)])
    memory = measured_memory(name, profile, plan)
    if memory is not None and not memory[0]:
        raise InputError(str(profile.source), "memory", "; ".join(memory[1]))
    warnings += memory[1] if memory is not None else []
    scenarios = [s.name for s in profile.bench.scenarios] if plan.bench else []
    listen = f"{plan.service.host}:{plan.service.port}"
    usable = [v["lock"] for v in verdicts if v["ok"]]
    summary = (f"profile {profile.name}, lock candidates {', '.join(usable) or 'none'} "
               f"(the host's driver, Python and glibc pick), "
               f"{_count(len(scenarios), 'bench scenario')}"
               f"{'' if plan.bench else ' (bench off)'}, listens on {listen}"
               + _weights_summary(profile) + _interpreter_summary(interpreter)
               + (f"; {plan.pd.summary}" if plan.pd else ""))
    details = {"profile": profile.name, "profile_file": str(profile.source),
               "newest_lock": plan.lock.name, "sglang_version": plan.version,
               "lock_candidates": verdicts, "bench_scenarios": scenarios, "listen": listen,
               "results_dir": str(plan.record.results_dir) if plan.record else None,
               "interpreter": interpreter, "pd_role": plan.pd.role if plan.pd else None}
    return Result(name, "serve", ok=True, summary=summary, warnings=warnings,
                  details=details)


def measured_memory(name: str, profile, plan) -> tuple[bool, list[str]] | None:
    """The memory fit of ``profile`` from its model record, calibrated by the host's last
    start of the same checkpoint (its directory: no host is read) and SGLang version
    that the serve deploy recorded on this controller (gpuserve/measure/starts.py);
    None without one."""
    from gpuserve.measure.starts import Checkpoint, last_measured, read_starts
    from gpuserve.serve.checks import results_root
    from gpuserve.serve.preflight import recorded_verdict

    if plan.start is None:
        return None
    starts = read_starts(results_root(plan.start.results_dir), name)
    start = last_measured(starts, Checkpoint(profile.model.path), plan.version)
    return recorded_verdict(profile, plan.version, start) if start is not None else None


def _interpreter_summary(found: dict | None) -> str:
    if not found:
        return ""
    if found["kind"] == "explicit":
        return f"; on {found['distribution']}: {found['reason']}"
    return (f"; on {found['distribution']}: {found['kind']} Python {found['version']}, lock "
            f"{found['lock']}")


def _weights_summary(profile) -> str:
    """Where the weights come from: a pinned Hub commit the deploy fetches, or a local
    directory that must already be on the host (the server runs offline)."""
    if profile.model.hf:
        return f"; weights {profile.model.hf} (the deploy fetches and verifies them)"
    return f"; weights {profile.model.path} (local: must be on the host)"


def interpreter_report(name: str, data: dict, source: str, locks: list) -> dict | None:
    """The interpreter the serve deploy would choose on a host whose data names its
    distribution (``host_distribution``), judged by that distribution's recorded
    answers (gpuserve/data/distros), with the lock it picks; None when the data does
    not say."""
    from gpuserve.serve.install import DEFAULTS, validate_home

    home = validate_home(data.get("sglang_home", DEFAULTS["sglang_home"]), source)
    found = recorded_choice(name, data, source, {lk.python for lk in locks}, home)
    if found is not None and found["python"] is not None:
        found["lock"] = max((lk for lk in locks if lk.python == found["python"]),
                            key=lambda lk: (_release(lk.sglang), lk.name)).name
    return found


def recorded_choice(name: str, data: dict, source: str, pythons: set[str], home: str,
                    role=None) -> dict | None:
    """The interpreter a deploy would choose for ``role``'s venv (SGLang's by default)
    and lock Pythons ``pythons`` on a host whose data names its distribution
    (``host_distribution``), judged by that distribution's recorded answers
    (gpuserve/data/distros); None when the data does not say."""
    from gpuserve.launch.interpreter import (
        SGLANG,
        choose_interpreter,
        known_distributions,
        recorded_facts,
    )
    from gpuserve.serve.install import python_wish

    role = role or SGLANG
    distro = data.get("host_distribution")
    wish = python_wish(data, source, role.key)
    asked = wish.asked
    if distro is None:
        return None
    try:
        facts = recorded_facts(distro) if isinstance(distro, str) else None
    except KeyError:
        facts = None
    if facts is None:
        raise InputError(source, "host_distribution", f"{distro!r:.80} is not one of "
                         f"{', '.join(known_distributions())}")
    if asked.startswith("/"):  # its version is read on the host only
        return {"distribution": distro, "kind": "explicit", "python": None, "version": "?",
                "path": asked, "lock": "by its version", "packages": [], "url": None,
                "sha256": None, "reason": f"{role.key} names {asked}; its version (and "
                "so the lock) is read on the host"}
    choice = choose_interpreter(facts, pythons, asked=asked, mirror=wish.mirror, home=home,
                                host=name, builds=wish.builds, role=role)
    return {"distribution": distro, "kind": choice.kind, "python": choice.python,
            "version": choice.version, "path": choice.path, "lock": None,
            "packages": list(choice.packages), "url": choice.url,
            "sha256": choice.build.sha256 if choice.build else None,
            "reason": choice.reason}


def check_host_deploy(name: str, data: dict, source: str) -> Result:
    """deploy/host.py's plan_host (its only prepare-time check of host data)."""
    from gpuserve.plans.host import plan_host

    s = plan_host(data, source)
    distro = data.get("host_distribution")
    if isinstance(distro, str):
        from gpuserve.host.driver import repository_branch_problem
        from gpuserve.launch.interpreter import known_distributions, recorded_facts

        if distro not in known_distributions():
            raise InputError(source, "host_distribution", f"{distro!r:.80} is not one of "
                             f"{', '.join(known_distributions())}")
        release = recorded_facts(distro).os_release
        problem = repository_branch_problem(release.get("ID"), release.get("VERSION_ID"),
                                            s.branch)
        if problem:
            raise InputError(source, "nvidia_driver_branch", problem)
    summary = (f"driver branch {s.branch} ({s.flavour}), CUDA {s.cuda_lane}, "
               f"repo {s.repo_url or 'NVIDIA'}, "
               f"reboot {'allowed' if s.kernel.allow_reboot else 'not allowed'}")
    details = {"driver_branch": s.branch, "driver_flavour": s.flavour,
               "cuda_lane": s.cuda_lane, "repo_url": s.repo_url,
               "kernel_extra_params": s.kernel.extra_params,
               "allow_reboot": s.kernel.allow_reboot, "nccl_env": s.nccl_overrides}
    return Result(name, "host", ok=True, summary=summary, details=details)


def check_hypervisor(name: str, data: dict, source: str) -> Result:
    """deploy/hypervisor.py's validation of host data (roles/kernel and roles/proxmox
    DEFAULTS under the host's data), as the deploy runs it before reading sysfs."""
    from gpuserve.host import defaults as host_defaults
    from gpuserve.host.host_data import hypervisor_settings

    merged = {**host_defaults.KERNEL, **host_defaults.PROXMOX}
    merged.update({k: v for k, v in data.items() if k in merged})
    s = hypervisor_settings(merged, source)
    guest = f"container {s.ctid}" if s.ctid is not None else f"VM {s.vmid}"
    gpus = ", ".join(s.gpus) if s.gpus else "every NVIDIA GPU in sysfs"
    path = ("device nodes bound in, the host keeps its driver" if s.ctid is not None
            else "vfio-pci passthrough")
    summary = (f"{guest}: {gpus} ({path}), reboot "
               f"{'allowed' if s.kernel.allow_reboot else 'not allowed'}")
    details = {"vmid": s.vmid, "ctid": s.ctid, "gpus": s.gpus, "vfio_ids": s.vfio_ids,
               "mmio_window_mb": s.mmio_window_mb, "clique": s.clique,
               "allow_reboot": s.kernel.allow_reboot, "restart_vm": s.restart_vm}
    return Result(name, "hypervisor", ok=True, summary=summary, details=details)


def _is_router_host(data: dict) -> bool:
    from gpuserve.plans.router import is_router_host

    return is_router_host(data)


def check_router(name: str, data: dict, source: str,
                 groups: dict[str, list[Member]] | None = None) -> Result:
    """deploy/router.py's plan_router (the router host's data and every host of its
    workers group), with the host's Python unknown: every smg lock is a candidate."""
    from gpuserve.plans.router import plan_router

    plan = plan_router(data, source, host_name=name, group_members=(groups or {}).get)
    interpreter = gateway_interpreter(name, data, source, plan)
    served = [w for w in plan.workers if not w.drained]
    drained = [w.host for w in plan.workers if w.drained]
    urls = ", ".join(w.url for w in served) or "-"
    drained_text = f", drained: {', '.join(drained)}" if drained else ""
    summary = (f"gateway on {plan.listen}:{plan.port} (metrics {plan.prometheus}:"
               f"{plan.prometheus_port}) for group {plan.group}: "
               f"{_count(len(served), 'worker')} ({urls}){drained_text}; lock candidates "
               f"{', '.join(lk.name for lk in plan.locks)}"
               + _interpreter_summary(interpreter))
    details = {"group": plan.group, "interpreter": interpreter,
               "listen": f"{plan.listen}:{plan.port}",
               "prometheus": f"{plan.prometheus}:{plan.prometheus_port}",
               "workers": [{"host": w.host, "url": w.url, "drained": w.drained}
                           for w in plan.workers],
               "lock_candidates": [lk.name for lk in plan.locks]}
    return Result(name, "router", ok=True, summary=summary, warnings=list(plan.warnings),
                  details=details)


def gateway_interpreter(name: str, data: dict, source: str, plan) -> dict | None:
    """The interpreter and smg lock the gateway deploy would choose on a host whose data
    names its distribution (``host_distribution``); None when it does not say."""
    from gpuserve.launch.interpreter import GATEWAY
    from gpuserve.plans.router import choose_app_lock

    found = recorded_choice(name, data, source, {lk.python for lk in plan.locks},
                            plan.home, GATEWAY)
    if found is not None and found["python"] is not None:
        found["lock"] = choose_app_lock(list(plan.locks), found["version"], None, name).name
    return found


def reachable(locks: list) -> list:
    """The locks some host would pick: choose_lock takes the newest runnable one, so a
    lock with a newer one of the same Python that needs no newer driver or glibc is
    never picked (reporting its problems would be noise)."""
    def shadows(a, b) -> bool:
        return (a.python == b.python and _release(a.sglang) > _release(b.sglang)
                and _release(a.driver_min) <= _release(b.driver_min)
                and _release(a.glibc_min) <= _release(b.glibc_min))
    return [b for b in locks if not any(shadows(a, b) for a in locks)]


def _release(version: str):
    """A lock's version field as the one version comparison reads it (local part dropped)."""
    return pep440.parse(pep440.public(version))


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def format_results(results: list[Result], deploys: tuple[str, ...]) -> str:
    """One line per host and deploy, warnings indented under it, then what was not
    checked (so a green run is never mistaken for a checked host)."""
    # every value escaped here: a line break in a host name must not forge a report line
    rows = []
    for r in results:
        rows.append([printable(r.host), r.deploy, "ok" if r.ok else "FAIL",
                     printable((r.summary if r.ok else r.error) or "")])
        rows += [["", "", "warn", printable(w)] for w in r.warnings]
        if r.proven:
            rows.append(["", "", "how", printable(r.proven)])
    lines = table(rows, rule=False, free_last=True)
    failed = sum(not r.ok for r in results)
    hosts = len({r.host for r in results})
    lines.append(f"# {_count(hosts, 'host')}, {_count(len(results), 'check')}, "
                 f"{failed} failed; no host was connected to")
    for d in deploys:
        lines.append(f"# not checked without the host ({d}): {'; '.join(NOT_CHECKED[d])}")
    if any(not r.proven and r.deploy in ("host", "serve", "router") for r in results):
        lines.append("# how proven (lab-tested, recorded outputs, untested) is said for hosts "
                     "whose data names host_distribution (docs/hosts.md)")
    return "\n".join(lines)
