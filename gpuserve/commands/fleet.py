"""``gpuserve fleet status INVENTORY``: per host, what it should run, what the gateway
says of it, and its last measured throughput; no SSH to any host.

Why: one table of a fleet's state that touches no worker: the profile and SGLang release
from the deploys' own prepare-time plan, the state from the router host's gateway
(``GET /workers``, its key never printed, no proxy, no redirect), the throughput from the
results directory. The pure part is gpuserve.fleet.status.

How: docs/fleet.md, "gpuserve.commands.fleet: columns, gateway and exit status"
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

from gpuserve.commands import check
from gpuserve.commands.compare import fmt, table
from gpuserve.errors import GpuserveError, InputError
from gpuserve.fleet import status as st
from gpuserve.fleet.rolling import parse_workers
from gpuserve.measure.compare import scenario_of
from gpuserve.measure.results import read_results, safe_name, validate_results_dir
from gpuserve.monitor.removed import removed_after
from gpuserve.redact import redact
from gpuserve.serve.running import difference, running_of_records
from gpuserve.terminal import printable

#: seconds; a gateway that has not answered by then is reported, not waited for
DEFAULT_TIMEOUT = 3.0
MAX_TIMEOUT = 60.0
#: parse_workers refuses more; reading stops one byte past it
MAX_ANSWER = 4 * 1024 * 1024


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "fleet", help="the fleet behind SGLang's gateway: status",
        description="Commands over a whole inventory behind SGLang's gateway (smg).")
    verbs = parser.add_subparsers(dest="fleet_command", metavar="VERB")
    status = verbs.add_parser(
        "status",
        help="per host: profile, SGLang version, the gateway's view, last throughput run",
        description="Per host of a pyinfra inventory: the profile and SGLang version the "
        "deploys would give it (the running one, by the last passing deploy's record, "
        "marked), its state in the gateway's GET /workers when the inventory has one "
        "(ready, draining, unhealthy, not listed, not behind a gateway), its last "
        "recorded throughput run and the monitor's live figures. No SSH connection. "
        "Exit 0: every gateway answered; 1: a gateway gave no usable answer or a host's "
        "data or records fail; 2: bad usage or inventory.")
    status.add_argument("inventory", help="pyinfra inventory file (e.g. inventory/gpu.py)")
    status.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                        help="override host data, as pyinfra's --data (repeatable)")
    status.add_argument("--group-data", dest="group_data", action="append", default=[],
                        metavar="PATH", help="extra group data, as pyinfra's --group-data")
    status.add_argument("--gateway", metavar="URL",
                        help="the gateway's base URL, instead of the router host's address "
                        "and router_port (e.g. an ssh -L tunnel); one router host only")
    status.add_argument("--prometheus", metavar="URL",
                        help="the monitor's Prometheus for the live figures, instead of the "
                        "first host of the inventory's monitor group on port 9090")
    status.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                        help=f"seconds to wait for the gateway (default {DEFAULT_TIMEOUT:g})")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=run)
    parser.set_defaults(func=lambda args: _usage(parser))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def run(args: argparse.Namespace) -> int:
    timeout = args.timeout
    if not (isinstance(timeout, float) and math.isfinite(timeout) and 0 < timeout <= MAX_TIMEOUT):
        raise InputError(None, "--timeout", f"must be seconds in (0, {MAX_TIMEOUT:g}], got "
                         f"{timeout!r}")
    override = st.check_gateway_override(args.gateway) if args.gateway is not None else None
    overrides = check.parse_data(args.data)
    hosts, groups = check.load_hosts(args.inventory, overrides, args.group_data)
    plans = router_plans(hosts, groups, args.inventory, override)
    answers = [fetch_workers(target, key, timeout) for target, key in plans]
    secrets = [key for _, key in plans]
    rows = [host_status(name, data, args.inventory, groups, answers) for name, data in hosts]
    live_url = prometheus_url(hosts, groups, args.inventory, args.prometheus)
    live, live_error = fetch_live(live_url, timeout) if live_url else ({}, None)
    for row in rows:
        row.live = live.get(row.host)
    if args.json:
        doc = st.status_dict(args.inventory, rows, answers)
        doc["prometheus"] = {"url": live_url, "error": live_error}
        print(redact(json.dumps(doc, indent=2, allow_nan=False), secrets))
    else:
        print(redact(format_status(rows, answers) + "\n" +
                     live_footer(live_url, live_error), secrets))
    return st.exit_code(rows, answers)


# ----------------------------------------------------------------------------- gateways


def router_plans(hosts: list[tuple[str, dict]], groups: dict, source: str,
                 override: str | None) -> list[tuple[st.GatewayTarget, str]]:
    """(target, API key) per router host, through the gateway deploy's own plan."""
    from gpuserve.plans.router import is_router_host, plan_router

    routers = [(name, data) for name, data in hosts if is_router_host(data)]
    if not routers and override is not None:
        raise InputError(source, "router_workers_group", "no host of this inventory sets "
                         "it, so there is no gateway for --gateway to replace")
    if override is not None and len(routers) > 1:
        raise InputError(None, "--gateway", f"the inventory has {len(routers)} router hosts "
                         f"({', '.join(n for n, _ in routers)}); --gateway replaces the "
                         "address of one gateway: use an inventory with one router host")
    out = []
    for name, data in routers:
        check.misspelt_keys(data, source)
        plan = plan_router(data, source, host_name=name, group_members=groups.get)
        url = override or st.gateway_url(name, data, plan.listen, plan.port, source)
        members = tuple(m.name for m in groups.get(plan.group) or ())
        target = st.GatewayTarget(
            router=name, group=plan.group, url=url, members=members,
            workers=tuple((w.host, w.url, w.drained) for w in plan.workers),
            overridden=override is not None)
        out.append((target, plan.api_key))
    return out


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # urllib would send the Authorization header to the new address


def fetch_workers(target: st.GatewayTarget, key: str, timeout: float) -> st.GatewayAnswer:
    """``GET <url>/workers`` with the key as a Bearer token, within ``timeout`` seconds
    in all; any failure is the answer's ``error`` (one line naming the URL)."""
    url = f"{target.url}/workers"
    source = f"GET {url}"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}",
                                                   "Accept": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect)
    hint = ("" if target.overridden else f" (the address comes from host {target.router}'s "
            "ssh_hostname, else its name, and router_listen_address; --gateway URL to use "
            "another, e.g. an ssh -L tunnel)")
    deadline = time.monotonic() + timeout
    try:
        with opener.open(request, timeout=timeout) as response:
            body = _read_within(response, deadline, timeout)
    except urllib.error.HTTPError as exc:
        return st.GatewayAnswer(target, None, _http_error(source, exc, target.router))
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        where = "" if isinstance(exc, http.client.HTTPException) else hint
        return st.GatewayAnswer(target, None, f"{source}: {_why(exc, timeout)}{where}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return st.GatewayAnswer(target, None, f"{source}: the answer is not UTF-8 text "
                                "(not smg's GET /workers)")
    try:
        workers = parse_workers(text, source)
    except InputError as exc:
        return st.GatewayAnswer(target, None, redact(str(exc), [key]))
    return st.GatewayAnswer(target, tuple(workers))


def _read_within(response, deadline: float, timeout: float) -> bytes:
    chunks, size = [], 0
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the answer took longer than {timeout:g} s")
        chunk = response.read(64 * 1024)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_ANSWER:
            raise http.client.HTTPException(f"the answer is larger than {MAX_ANSWER // 2**20} "
                                            "MiB (not a fleet's worker list)")


def _http_error(source: str, exc: urllib.error.HTTPError, router: str) -> str:
    exc.close()
    if exc.code in (401, 403):
        return (f"{source}: HTTP {exc.code}: the gateway refused the key (host {router}'s "
                "router_api_key is not the key it runs with: rerun deploy/router.py)")
    if 300 <= exc.code < 400:
        return (f"{source}: HTTP {exc.code}: a redirect, not followed (the key would go "
                "with it); give the gateway's own address")
    return f"{source}: HTTP {exc.code} {exc.reason}"[:300]


def _why(exc: BaseException, timeout: float) -> str:
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, TimeoutError | socket.timeout):
        return f"no answer within {timeout:g} s"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused (no gateway listening there)"
    if isinstance(reason, http.client.HTTPException) and str(reason):
        return str(reason)
    if isinstance(reason, socket.gaierror):
        return f"cannot resolve the host name ({reason.strerror})"
    return f"{type(reason).__name__}: {reason}"[:300]


# ----------------------------------------------------------------------------- live


def prometheus_url(hosts: list[tuple[str, dict]], groups: dict, source: str,
                   override: str | None) -> str | None:
    """``--prometheus``, else the first monitor host's Prometheus; None without one."""
    from gpuserve.monitor.targets import scrape_address

    if override is not None:
        return st.check_gateway_override(override, "--prometheus")
    members = groups.get("monitor") or []
    if not members:
        return None
    first = members[0]
    address = scrape_address(first.name, first.data, source)
    return f"http://{address}:9090"


def fetch_live(url: str, timeout: float) -> tuple[dict, str | None]:
    """Each live column's instant query; (host -> figures, the first error or None)."""
    from gpuserve.monitor.query import LIVE_QUERIES, live_by_host, parse_vector, query_path

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect)
    answers: dict[str, dict] = {}
    deadline = time.monotonic() + timeout
    for column, rule in LIVE_QUERIES.items():
        source = f"GET {url}{query_path(rule)}"
        try:
            left = max(0.1, deadline - time.monotonic())
            with opener.open(urllib.request.Request(url + query_path(rule)),
                             timeout=left) as response:
                text = _read_within(response, deadline, timeout).decode("utf-8")
            answers[column] = parse_vector(text, source)
        except urllib.error.HTTPError as exc:
            exc.close()
            return {}, f"{source}: HTTP {exc.code} {exc.reason}"[:300]
        except (urllib.error.URLError, OSError, http.client.HTTPException,
                UnicodeDecodeError) as exc:
            why = _why(exc, timeout).replace(" (no gateway listening there)", "")
            return {}, f"{source}: {why}"
        except InputError as exc:
            return {}, str(exc)[:300]
    return live_by_host(answers), None


def live_footer(url: str | None, error: str | None) -> str:
    if url is None:
        return ("live: no monitor host in the inventory (deploy/monitor.py's Prometheus, "
                "or --prometheus URL)")
    if error:
        return f"live: no figures: {error}"
    return (f"live (from {url}): tok/s over the last minute, requests running/queued and "
            "KV usage now, TTFT p50/p99 over the last 5 minutes")


# ----------------------------------------------------------------------------- hosts


def host_status(name: str, data: dict, source: str, groups: dict,
                answers: list[st.GatewayAnswer]) -> st.HostStatus:
    from gpuserve.plans.router import is_router_host

    row = st.HostStatus(host=name, views=st.views_of(name, answers))
    if is_router_host(data):
        row.router_of = (str(data["router_workers_group"]),)
        row.views = [v for v in row.views if v.view != "not_behind_gateway"]
    if data.get("profile") not in (None, ""):
        _plan(row, name, data, source, groups)
    _records(row, name, data, source)
    return row


def _plan(row: st.HostStatus, name: str, data: dict, source: str, groups: dict) -> None:
    """Profile and SGLang release(s) through gpuserve check's run of the serve plan."""
    from gpuserve.launch.lock_choice import public_version
    from gpuserve.launch.locks import load_locks

    result = check.check_host(name, data, source, "serve", groups)
    if not result.ok:
        row.plan_error = result.error
        return
    details = result.details
    row.profile, row.profile_file = details["profile"], details["profile_file"]
    row.role = details.get("pd_role")
    locks = {lk.name: lk for lk in load_locks(data.get("sglang_locks_dir") or None,
                                               source=source, field="sglang_locks_dir")}
    usable = [v["lock"] for v in details["lock_candidates"] if v["ok"]]
    versions = [public_version(locks[n].sglang) for n in usable if n in locks]
    row.sglang_versions = tuple(dict.fromkeys(versions)) or (details["sglang_version"],)
    row.pinned = data.get("sglang_version") not in (None, "")


def _records(row: st.HostStatus, name: str, data: dict, source: str) -> None:
    """The last run under the results directory the serve deploy writes for the host."""
    from gpuserve.serve.checks import DEFAULTS, results_root

    try:
        directory = validate_results_dir(data.get("results_dir", DEFAULTS["results_dir"]),
                                         source)
    except InputError as exc:
        row.records_error = str(exc)
        return
    if directory is None:
        return  # recording off
    host_dir = results_root(directory) / safe_name(name)
    row.results_dir = str(host_dir)
    if not Path(host_dir).is_dir():
        return
    try:
        records = read_results(host_dir)
    except (GpuserveError, OSError) as exc:
        row.records_error = str(exc)
        return
    row.last_run = st.last_run(records, name)
    newest = max((r.timestamp for r in records if r.timestamp), default=None)
    if removed_after(Path(host_dir), newest) is None:  # deploy/remove.py: nothing runs
        row.running = running_of_records(records, name)


# ----------------------------------------------------------------------------- text

HEADERS = ("host", "profile", "sglang", "gateway", "health", "out tok/s", "last run",
           "tok/s now", "run/queue", "KV", "TTFT p50/p99", "PD role")


def _gateway_cell(row: st.HostStatus) -> str:
    parts = [f"router of {', '.join(row.router_of)}"] if row.router_of else []
    many = len({v.router for v in row.views}) > 1
    for v in row.views:
        parts.append(f"{v.router}: {v.text}" if many else v.text)
    return "; ".join(parts) or "-"


def _health_cell(row: st.HostStatus, answers: list[st.GatewayAnswer]) -> str:
    """smg's is_healthy per view; a router host: whether its gateway answered."""
    words = [("answers" if a.workers is not None else "no answer") for a in answers
             if a.target.router == row.host]
    words += [{True: "healthy", False: "unhealthy", None: "-"}[v.healthy] for v in row.views]
    return "; ".join(words) if any(w != "-" for w in words) else "-"


def _run_cell(row: st.HostStatus) -> str:
    r = row.last_run
    if r is None:
        return "-"
    text = f"{r.timestamp or 'no timestamp'} {scenario_of(r)}"
    if r.kind == "bench" and r.concurrency is not None:
        text += f" c{r.concurrency}"
    if r.profile and r.profile != row.profile:
        text += f" (profile {r.profile})"
    if r.gate is not None and r.gate.get("passed") is False:
        text += " gate FAIL"
    return text


def _profile_cell(row: st.HostStatus) -> str:
    """The profile that runs (the last passing record's); ``*`` when it is not the one
    the inventory names, which follows in brackets."""
    running = row.running.profile if row.running is not None else None
    if running is None or running == row.profile:
        return running or row.profile or "-"
    return f"{running}* (inventory: {row.profile or '-'})"


def _versions_cell(row: st.HostStatus) -> str:
    if not row.sglang_versions:
        return "-"
    return "/".join(row.sglang_versions) + ("" if row.pinned or len(row.sglang_versions) == 1
                                            else " (host picks)")


def _live_cells(live) -> tuple[str, str, str, str]:
    if live is None:
        return "-", "-", "-", "-"

    def num(key: str, form: str = "{:.0f}") -> str:
        value = live.get(key)
        return "-" if value is None else form.format(value)

    ms = "{:.0f}"
    p50 = live.get("ttft_p50_s")
    p99 = live.get("ttft_p99_s")
    ttft = "-" if p50 is None and p99 is None else \
        f"{'-' if p50 is None else ms.format(p50 * 1000)}/" \
        f"{'-' if p99 is None else ms.format(p99 * 1000)} ms"
    return (num("tok_s"), f"{num('running')}/{num('queued')}",
            num("kv_usage", "{:.0%}"), ttft)


def _pd_line(row: st.HostStatus) -> str | None:
    """A PD host's live transfer figures (SGLang's PD metrics through the monitor's
    rules), or None for a regular host or one without figures."""
    from gpuserve.monitor.query import PD_COLUMNS

    live = row.live
    if row.role is None or live is None or all(live.get(k) is None for k in PD_COLUMNS):
        return None

    def num(key: str, form: str = "{:.0f}") -> str:
        value = live.get(key)
        return "-" if value is None else form.format(value)

    return (f"{row.host}: {row.role}: {num('pd_queue')} request(s) in its PD queues, "
            f"KV transfer p99 {num('kv_transfer_p99_ms')} ms, failures in 5 min: "
            f"{num('pd_bootstrap_failed')} bootstrap, {num('pd_transfer_failed')} transfer")


def format_status(rows: list[st.HostStatus], answers: list[st.GatewayAnswer]) -> str:
    cells = [(r.host, _profile_cell(r), _versions_cell(r), _gateway_cell(r),
              _health_cell(r, answers),
              fmt(r.last_run.output_tok_s) if r.last_run else "-", _run_cell(r),
              *_live_cells(r.live), r.role or "-")
             for r in rows]
    lines = table(HEADERS, cells, {"out tok/s", "tok/s now"})
    lines += [line for r in rows if (line := _pd_line(r))]
    for r in rows:
        lines += [f"{r.host}: {v.text}: {v.note}" for v in r.views
                  if v.note and v.view != "no_answer"]
        diff = difference(r.running, r.profile)
        if diff:
            lines.append(f"{r.host}: {diff}")
        if r.plan_error:
            lines.append(f"{r.host}: FAIL (deploy checks): {r.plan_error}")
        if r.records_error:
            lines.append(f"{r.host}: FAIL (records): {r.records_error}")
    lines.append("")
    if not answers:
        lines.append("no gateway in the inventory (no host sets router_workers_group): "
                     "every host is shown as not behind a gateway")
    for a in answers:
        t = a.target
        if a.workers is None:
            lines.append(f"gateway {t.router} (group {t.group}): no usable answer: {a.error}")
            continue
        lines.append(f"gateway {t.router} (group {t.group}) at {t.url}: {len(a.workers)} "
                     f"listed, {a.ready} ready")
        lines += [f"gateway {t.router} lists {url}, which is no host of group {t.group}"
                  for url in a.unknown_workers]
    lines += ["no SSH connection was made; health: the gateway's own checks of each worker",
              "profile: the one running (the last passing deploy's record); * marks one the "
              "inventory does not name",
              "sglang: the release(s) the host's driver, Python and glibc choose from (host "
              "data sglang_version pins one); last run: the latest bench record (else "
              "smoke) under the host's results directory"]
    return "\n".join(printable(line) for line in lines)
