"""A rolling switch behind SGLang's gateway: take a worker out, switch it, put it back.

Why: switching every worker at once takes the whole fleet's model down. Under ``pyinfra
--serial`` the serve deploy takes a worker out of the gateway just before its server
restarts, puts it back once its checks pass, and stops the rollout at the first failed
worker; without ``--serial`` it refuses before any change.

How: docs/rolling-switch.md, "gpuserve.roles.router.rolling: the steps"
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field

from pyinfra import host, inventory, logger, state
from pyinfra.api import FactBase, FunctionCommand, StringCommand, operation
from pyinfra.api.exceptions import PyinfraError

from gpuserve.errors import InputError
from gpuserve.facts.compat import (
    current_inventory,
    current_state,
    failed_host_names,
    sort_active_hosts,
)
from gpuserve.fleet.rolling import GatewayWorker, normal_url, parse_workers, take_out_refusal
from gpuserve.launch.lock_choice import PreflightError
from gpuserve.plans.router import (
    KEY_PATH,
    MANIFEST_PATH,
    PROBE,
    RouterPlan,
    is_router_host,
    manifest_text,
    plan_router,
)
from gpuserve.plans.router import UNIT_NAME as ROUTER_UNIT
from gpuserve.roles.base import failure, managed
from gpuserve.roles.base.inventory import group_members
from gpuserve.roles.base.run_context import run_context
from gpuserve.roles.checks.probe import SglangProbe
from gpuserve.roles.checks.scripts import IDLE
from gpuserve.roles.checks.scripts import PROBE as HEALTH_PROBE
from gpuserve.roles.service.rollback import (
    RollbackSpec,
    ServiceConfigState,
    parse_state,
    state_command,
)
from gpuserve.serve.service import UNIT_NAME


@dataclass(frozen=True)
class Rollout:
    """This worker's place behind its gateway, for one run of the serve deploy."""

    router: str  # inventory name of the router host
    worker: str  # this host's inventory name
    url: str  # this worker in the gateway's manifest
    desired: tuple[str, ...]  # the served workers' URLs (the group, less drained hosts)
    members: tuple[str, ...]  # the hosts of the workers group, for the guard
    manifest_with: str
    manifest_without: str
    manifest_group: str  # the router's account: the manifest is root:<it> 0640
    probe: str  # smg_probe.py on the router host
    port: int  # the gateway's port on the router host
    max_unavailable: int
    drain_timeout: float
    idle_timeout: float
    drain_grace: float
    ready_timeout: float
    # the served workers after this one in the inventory's order (the order of a serial
    # rollout): the hosts not switched yet, which the live judgement compares it with
    later: tuple[str, ...] = ()


@dataclass
class Switching:
    """Set at prepare time once the service role knows the server will restart (with
    the rollout planned then); read by the guard, created earlier, executed later."""

    restarts: bool = False
    rollout: Rollout | None = None
    out: bool = field(default=False)  # execute time: the worker is out of the gateway
    gateway_stopped: bool = False  # execute time: no gateway runs, nothing to take out




def _router_plan(name: str, data: dict, source: str) -> RouterPlan:
    plans = run_context().router_plans
    if name not in plans:  # one plan per gateway and run, not one per worker
        plans[name] = plan_router(data, source, host_name=name, group_members=group_members)
    return plans[name]


def gateway_of(host_name: str, source: str) -> str | None:
    """The router host whose ``router_workers_group`` lists this host with at least one
    other host, or None. Reads only the inventory (no plan): every serve deploy asks, so
    it must be cheap and must not refuse a host for its gateway's data when it will not
    roll (:func:`plan_rollout` does that, for a host that restarts)."""
    routers = []
    for candidate in current_inventory():
        data = candidate.data.dict()
        if not is_router_host(data):
            continue
        names = [m.name for m in group_members(data.get("router_workers_group")) or ()]
        if host_name in names and len(names) > 1:
            routers.append(candidate.name)
    if len(routers) > 1:
        raise InputError(source, "router_workers_group", f"host {host_name} is a worker of "
                         f"{len(routers)} gateways ({', '.join(routers)}); a rolling switch "
                         "takes a worker out of one gateway")
    return routers[0] if routers else None


def plan_rollout(host_name: str, source: str) -> Rollout | None:
    """How this host leaves and rejoins its gateway, for a restart (prepare time), or
    None: not behind a gateway, drained by hand, a multi-node rank > 0 (no HTTP), or the
    gateway's only served worker (a restart is then an outage either way). Bad router
    data is an ``InputError``, before any change."""
    router_name = gateway_of(host_name, source)
    if router_name is None:
        return None
    router = inventory.get_host(router_name)
    plan = _router_plan(router.name, router.data.dict(), source)
    mine = next((w for w in plan.workers if w.host == host_name), None)
    if mine is None or mine.drained:
        return None
    served = plan.served
    others = tuple(w for w in served if w.host != host_name)
    # in a PD fleet a role stands alone: a prefill's requests go to another prefill only
    peers = [(w.host, normal_url(w.url)) for w in others if w.role == mine.role]
    if not peers:
        # the gateway's only worker (of its role): nothing can take its requests while it
        # restarts, and taking it out would only fail them sooner (take_out_refusal
        # would refuse); said before any change when that empties a PD role
        if mine.role:
            logger.warning(lone_role_restart(host_name, mine.role, router.name))
        return None
    return Rollout(
        router=router.name, worker=host_name, url=normal_url(mine.url),
        desired=tuple(normal_url(w.url) for w in served if w.role == mine.role),
        members=tuple(m.name for m in group_members(plan.group) or ()),
        manifest_with=manifest_text(served), manifest_without=manifest_text(others),
        manifest_group=plan.user, probe=f"{plan.bin_dir}/{PROBE}", port=plan.port,
        max_unavailable=plan.max_unavailable, drain_timeout=plan.drain_timeout,
        idle_timeout=plan.idle_timeout, drain_grace=plan.drain_grace,
        ready_timeout=max(plan.ready_timeout, 60.0),
        later=_after_in_inventory(host_name, peers))


def lone_role_restart(host_name: str, role: str, router: str) -> str:
    """The warning of a restart that leaves a PD role without a server: smg in PD mode
    needs a prefill and a decode server for every request."""
    return (f"{host_name}: rolling switch: the only {role} server behind the gateway on "
            f"{router} restarts without a drain: every request through the gateway fails "
            f"until it serves again (give each role two hosts, or change only the other "
            "role's launch, for a switch with 0 failed requests)")


def _after_in_inventory(host_name: str, workers: list[tuple[str, str]]) -> tuple[str, ...]:
    """The URLs of ``workers`` (host, URL) that come after ``host_name`` in the
    inventory, in that order (as a serial rollout goes: :func:`_serial_in_inventory_order`)."""
    order = {h.name: i for i, h in enumerate(current_inventory() or ())}
    mine = order.get(host_name, len(order))
    later = sorted((order.get(h, len(order)), h, url) for h, url in workers)
    return tuple(url for index, h, url in later if (index, h) > (mine, host_name))


def runs_serially() -> bool:
    """Whether pyinfra was started with ``--serial`` (host by host): its CLI's own
    parsed flag (gpuserve.roles.base.run_context)."""
    return run_context().serial


def _serial_in_inventory_order() -> None:
    """pyinfra keeps the active hosts in a set, and ``--serial`` runs them in that set's
    iteration order (hash order: arbitrary, and not the same from run to run). A rollout
    goes through the hosts in the inventory's order instead, so that users know which
    host is first (a canary) and which hosts a stopped rollout left on the old profile."""
    order = {h.name: i for i, h in enumerate(current_inventory() or ())}
    sort_active_hosts(current_state(),
                      key=lambda h: (order.get(h.name, len(order)), h.name))


def register_restart(rollout: Rollout, switching: Switching) -> None:
    """At prepare time, when this worker's server will restart: refuse a parallel run in
    which another worker of the same gateway restarts too (before any change); in a
    serial run, make pyinfra go through the hosts in the inventory's order."""
    switching.restarts = True
    switching.rollout = rollout
    if runs_serially():
        _serial_in_inventory_order()
    hosts = run_context().restarting.setdefault(rollout.router, [])
    if rollout.worker not in hosts:
        hosts.append(rollout.worker)
    if len(hosts) > 1 and not runs_serially():
        raise PreflightError(
            f"{', '.join(hosts)} would all restart at once behind the gateway on "
            f"{rollout.router}: pyinfra runs each operation on every host together unless "
            "it is started with --serial; run `pyinfra --serial ... deploy/serve.py` for a "
            "rolling switch (one host at a time, each taken out of the gateway first); "
            "nothing on any host was changed")


class GatewayView(FactBase):
    """smg_probe.py on the router host: ``GET /workers`` until worker ``url`` is gone or
    ready (``until``), or at once (``timeout`` 0); one JSON line."""

    def command(self, script: str, port: int, url: str, until: str, timeout: float) -> str:
        # a router host the gateway deploy has not reached yet has no probe: no gateway
        # answers there (the caller then asks systemd whether one is meant to run)
        absent = json.dumps({"live": False, "error": f"{script} is not installed"})
        return f"test -f {shlex.quote(script)} || {{ echo {shlex.quote(absent)}; exit 0; }}; " + \
            " ".join(shlex.quote(a) for a in (
                "python3", script, "--port", str(port), "--key-file", KEY_PATH,
                "--live-timeout", "10", "--ready-timeout", f"{timeout:.0f}", "--url", url,
                "--until", until)) + " 2>&1 || true"

    def process(self, output: list[str]) -> str:
        return "\n".join(output)


class EngineIdle(FactBase):
    """sglang_idle.py on the worker: wait until no request is in flight; one JSON line."""

    def command(self, script: str, port: int, config: str, timeout: float) -> str:
        return " ".join(shlex.quote(a) for a in (
            "python3", script, "--port", str(port), "--config", config,
            "--timeout", f"{timeout:.0f}")) + " 2>&1 || true"

    def process(self, output: list[str]) -> str:
        return "\n".join(output)


def connected_router(rollout: Rollout):
    """The router host, connected (a run limited to the workers, ``--limit``, has not
    connected to it yet)."""
    router = inventory.get_host(rollout.router)
    if not router.connected:
        router.connect(reason="the rolling switch reads and edits its gateway's workers",
                       raise_exceptions=True)
    return router


def _view(router, rollout: Rollout, until: str, timeout: float) -> tuple[dict, list[GatewayWorker]]:
    """The probe's JSON and the gateway's workers (strictly parsed); raises ValueError
    with what went wrong."""
    text = router.get_fact(GatewayView, script=rollout.probe, port=rollout.port,
                           url=rollout.url, until=until, timeout=timeout) or ""
    try:
        result = json.loads(text.splitlines()[-1])
    except (ValueError, IndexError):
        raise ValueError(f"smg_probe.py on {rollout.router} printed {text[-200:]!r}") from None
    if not result.get("live"):
        raise GatewayDown(f"the gateway on {rollout.router}:{rollout.port} does not answer "
                         f"GET /liveness ({result.get('error')})")
    if result.get("error"):
        raise ValueError(f"GET /workers on {rollout.router}: {result['error']}")
    workers = parse_workers(json.dumps({"workers": result.get("workers") or []}),
                            f"GET /workers on {rollout.router}")
    return result, workers


class GatewayDown(ValueError):
    """The gateway does not answer ``GET /liveness``."""


def _gateway_unit_state(router) -> str | None:
    """What ``systemctl is-active`` prints for the gateway's unit on the router host
    ("inactive" for a gateway stopped on purpose or not deployed yet, "failed",
    "activating" while systemd restarts it, ...); None when it could not be asked (the
    caller then refuses, as for any gateway it cannot read)."""
    ok, output = router.run_shell_command(
        f"systemctl is-active {shlex.quote(ROUTER_UNIT)} || true")
    lines = [line.strip() for line in output.stdout_lines if line.strip()] if ok else []
    return lines[-1] if lines else None


#: ``systemctl is-active`` states of a gateway that routes nothing and will not start by
#: itself (not "activating": systemd is restarting it)
GATEWAY_STOPPED = frozenset({"inactive", "failed", "unknown"})


def _write_manifest(router, rollout: Rollout, text: str) -> None:
    command: StringCommand = managed.write_command(MANIFEST_PATH, text, "root",
                                                   rollout.manifest_group, "640")
    ok, output = router.run_shell_command(command, **command.connector_arguments)
    if not ok:
        raise ValueError(f"writing {MANIFEST_PATH} on {rollout.router} failed: "
                         f"{' '.join(output.stderr_lines)[-300:]}")


def _states(workers: list[GatewayWorker]) -> str:
    return ", ".join(f"{w.url} {w.status}" for w in workers) or "no workers"


@operation(is_idempotent=True)
def rollout_guard(router: str, switching: Switching):
    """First operation of a worker behind a gateway: when it will restart, stop when an
    earlier worker of the same gateway failed in this run (``--serial``), so this one
    keeps its profile. Nothing (no command) otherwise."""
    rollout = switching.rollout
    if not state.is_executing or not switching.restarts or rollout is None:
        return
    failed = sorted(name for name in failed_host_names(state)
                    if name in rollout.members and name != host.name)
    if failed:
        yield failure.fail_host(
            f"rolling switch: not switched: {', '.join(failed)} failed first behind the "
            f"gateway on {rollout.router}; {host.name} was not changed and keeps its "
            "current profile", [])


@operation()
def take_out(rollout: Rollout, switching: Switching, bin_dir: str, port: int, config: str):
    """Take this worker out of the gateway, wait until it is dropped and idle."""
    if not state.is_executing:
        return
    yield execute_time_command(take_out_now, rollout, switching, bin_dir, port, config)


def execute_time_command(func, *args) -> FunctionCommand:
    """A command running ``func(host, *args)`` at execute time; its False fails the host
    (pyinfra passes ``state`` and ``host`` only to a function with those argument names,
    and uses its result only then)."""

    def run(state, host) -> bool:  # noqa: ARG001
        return func(host, *args)

    return FunctionCommand(run, (), {})


#: what a take-out that fails before the switch says of the host
NOT_SWITCHED = "not switched, nothing changed"


def take_out_now(host_, rollout: Rollout, switching: Switching, bin_dir: str, port: int,
              config: str, outcome: str = NOT_SWITCHED) -> bool:
    """Take the worker out (see :func:`take_out`); ``outcome`` ends a failure's message
    (a take-out to roll back a live regression says what keeps serving instead)."""
    t0 = time.monotonic()
    try:
        router = connected_router(rollout)
        try:
            _, workers = _view(router, rollout, "ready", 0)
        except GatewayDown:
            unit = _gateway_unit_state(router)
            if unit in GATEWAY_STOPPED:
                # not deployed yet, or stopped: nothing is routed through it, so there
                # is nothing to drain; when it starts it reads the manifest, which keeps
                # this worker, and finds it once it is healthy
                logger.warning(f"{host_.name}: gateway: {ROUTER_UNIT} on {rollout.router} "
                               f"is {unit}: no traffic through it to drain, switching")
                switching.gateway_stopped = True
                return True
            raise
        refusal = take_out_refusal(rollout.url, rollout.desired, workers,
                                   rollout.max_unavailable)
    except (ValueError, InputError, PyinfraError) as exc:
        return _fail(host_, f"rolling switch: cannot read the gateway's workers: {exc}; "
                     f"{outcome}")
    mine = next((w for w in workers if w.url == rollout.url), None)
    if mine is None or not mine.ready:
        # the gateway sends it nothing now (not listed yet, pending, unhealthy): nothing
        # to drain, and restarting it takes no capacity away; put back (and wait for it
        # to be ready) all the same, from the failure path too
        logger.info(f"{host_.name}: gateway: {rollout.url} is "
                    f"{mine.status if mine else 'not listed'} in {rollout.router}'s list: "
                    "no traffic to drain")
        switching.out = True
        failure.on_failure(host_.name, lambda: _put_back_after_failure(rollout, switching,
                                                                       bin_dir, port))
        return True
    if refusal is not None:
        return _fail(host_, f"rolling switch: {host_.name} may not leave the gateway now: "
                     f"{refusal} (gateway: {_states(workers)}); {outcome}")
    try:
        _write_manifest(router, rollout, rollout.manifest_without)
    except ValueError as exc:
        return _fail(host_, f"rolling switch: {exc}; {outcome}")
    switching.out = True
    # from here a failure of any kind (even a command error pyinfra catches) must not
    # leave the worker out unsaid: the hook puts it back when its server is healthy
    failure.on_failure(host_.name, lambda: _put_back_after_failure(rollout, switching,
                                                                   bin_dir, port))
    problem = _drained(host_, router, rollout, bin_dir, port, config, t0)
    if problem is not None:
        # the server still runs its old configuration: back into the gateway at once
        back = _put_back_and_wait(host_, rollout, switching)
        said = "not switched" if outcome == NOT_SWITCHED else outcome
        return _fail(host_, f"rolling switch: {problem}; {said}",
                     [f"gateway: {back}" if back else
                      f"gateway: {host_.name} is back in {rollout.router}'s list, unchanged"])
    return True


def _drained(host_, router, rollout: Rollout, bin_dir: str, port: int, config: str,
             t0: float) -> str | None:
    """Wait until the gateway has dropped the worker, then until its engine is idle;
    what went wrong, or None."""
    try:
        result, workers = _view(router, rollout, "gone", rollout.drain_timeout)
    except (ValueError, InputError) as exc:
        return f"taken out, then: {exc}"
    if not result.get("reached"):
        return (f"the gateway still lists {rollout.url} {rollout.drain_timeout:.0f} s after "
                f"it left the manifest ({_states(workers)})")
    logger.info(f"{host_.name}: gateway: out of {rollout.router}'s list after "
                f"{time.monotonic() - t0:.0f} s ({_states(workers)})")
    return _wait_idle(host_, rollout, bin_dir, port, config)


def _wait_idle(host_, rollout: Rollout, bin_dir: str, port: int, config: str) -> str | None:
    """Wait until the engine has nothing in flight; the reason it could not, or None."""
    text = host_.get_fact(EngineIdle, script=f"{bin_dir}/{IDLE}", port=port,
                          config=config, timeout=rollout.idle_timeout) or ""
    try:
        result = json.loads(text.splitlines()[-1])
    except (ValueError, IndexError):
        return f"{IDLE} printed {text[-200:]!r}"
    if result.get("idle"):
        logger.info(f"{host_.name}: gateway: engine idle ({result.get('source')}, waited "
                    f"{result.get('waited')} s)")
        return None
    if result.get("source") is None:
        logger.warning(f"{host_.name}: gateway: the server reports no load "
                       f"({result.get('error')}); waiting router_drain_grace = "
                       f"{rollout.drain_grace:.0f} s for requests still running")
        time.sleep(rollout.drain_grace)
        return None
    return str(result.get("error") or "the engine did not become idle")


@operation()
def put_back(rollout: Rollout, switching: Switching):
    """Put this worker back into the gateway and wait until it is ready there."""
    if not state.is_executing:
        return
    yield execute_time_command(_put_back, rollout, switching)


def _put_back(host_, rollout: Rollout, switching: Switching) -> bool:
    if switching.gateway_stopped:
        return True  # never taken out: the manifest still lists it
    problem = _put_back_and_wait(host_, rollout, switching)
    if problem is None:
        return True
    return _fail(host_, f"rolling switch: {problem}")


def _put_back_and_wait(host_, rollout: Rollout, switching: Switching) -> str | None:
    t0 = time.monotonic()
    try:
        router = connected_router(rollout)
        _write_manifest(router, rollout, rollout.manifest_with)
        switching.out = False
        failure.clear(host_.name)
        result, workers = _view(router, rollout, "ready", rollout.ready_timeout)
    except (ValueError, InputError, PyinfraError, OSError) as exc:
        return f"putting {rollout.url} back: {exc}"
    if not result.get("reached"):
        return (f"{rollout.url} is back in the manifest but not ready in the gateway after "
                f"{rollout.ready_timeout:.0f} s ({_states(workers)})")
    logger.info(f"{host_.name}: gateway: back in {rollout.router}'s list, ready after "
                f"{time.monotonic() - t0:.0f} s")
    return None


def _put_back_after_failure(rollout: Rollout, switching: Switching, bin_dir: str,
                            port: int) -> list[str]:
    """From a failure report: put the worker back when it serves its last good
    configuration again and answers /health; lines for the report."""
    if not switching.out:
        return []
    try:
        config = parse_state(host.get_fact(
            ServiceConfigState, script=state_command(RollbackSpec(profile_name=""))))
        healthy = _answers_health(bin_dir, port)
    except Exception as exc:  # noqa: BLE001 - a failure path: report, never raise
        return [f"gateway: {host.name} stays out of {rollout.router}'s list: its state "
                f"could not be read ({type(exc).__name__}: {exc}); `pyinfra ... "
                "deploy/router.py` puts it back once it is fixed"]
    if not (healthy and config.live_is_saved):
        why = "its server does not answer /health" if not healthy else \
            "it does not run its last good configuration"
        return [f"gateway: {host.name} stays out of {rollout.router}'s list: {why}; "
                "`pyinfra ... deploy/router.py` puts it back once it is fixed"]
    problem = _put_back_and_wait(host, rollout, switching)
    if problem is not None:
        return [f"gateway: {problem}"]
    return [f"gateway: {host.name} is back in {rollout.router}'s list and ready "
            "(on its last good configuration)"]


def _answers_health(bin_dir: str, port: int) -> bool:
    """Whether the server answers /health 200 (one probe, no wait)."""
    try:
        probe = json.loads(host.get_fact(SglangProbe, script=f"{bin_dir}/{HEALTH_PROBE}",
                                         unit=UNIT_NAME, port=port))
    except (ValueError, TypeError):
        return False
    return probe.get("health") == 200


def _fail(host_, message: str, footer: tuple[str, ...] | list[str] = ()) -> bool:
    """Report like roles/base/failure.fail_host (with the failure hooks), fail the host."""
    return failure.fail_report(host_, message, [], footer)
