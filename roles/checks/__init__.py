"""Health gate and smoke completion: verify the served model, change nothing.

Why reads, not commands: pyinfra counts an operation that ran a command as a change, so
a ``curl`` health check would make every rerun report changes. The checks run their
probes as facts at execute time and yield nothing when they pass; a failed check yields
one ``FunctionCommand`` that fails the host. A passing smoke check may write a result
record on the controller; a failed health gate may first roll back to the last good
configuration.

How: docs/reruns.md, "gpuserve.roles.checks: how a check stays a read"
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass

from pyinfra import host, logger, state
from pyinfra.api import FactBase, QuoteString, StringCommand, deploy, operation

from gpuserve.errors import InputError
from gpuserve.launch.bench import BenchMode, OnRegression, client_argv, judge, result_line
from gpuserve.measure.health import (
    Decision,
    ProbeError,
    Verdict,
    decide,
    parse_probe,
    progress_line,
    restart_warning,
)
from gpuserve.measure.results import (
    RecordSpec,
    bench_record,
    last_good,
    parse_sglang_line,
    safe_name,
    smoke_record,
    utc_now,
    write_record,
)
from gpuserve.measure.smoke import SmokeError, parse_smoke_output, smoke_line
from gpuserve.paths import SCRIPTS_DIR
from gpuserve.roles import managed
from gpuserve.roles.checks.bench import BenchMark, _poll, _results_for, _script_command
from gpuserve.roles.failure import fail_host
from gpuserve.roles.prefetch import Read, changed_so_far, fact_if_unchanged, prefetched
from gpuserve.roles.run_context import run_context
from gpuserve.roles.service.rollback import (
    RollbackSpec,
    read_state,
    restore_script,
    rollback_decision,
    rollback_outcome,
)
from gpuserve.serve import install as sglang
from gpuserve.serve import service
from gpuserve.serve.checks import (  # DEFAULTS: re-exported
    DEFAULTS,  # noqa: F401
    BenchPlan,
    results_root,
)
from gpuserve.serve.plan import ServeInput
from gpuserve.serve.render import SERVICE_ENV_PATH, profile_line

PROBE = "sglang_probe.py"
SMOKE = "sglang_smoke.py"
BENCH = "sglang_bench.py"
IDLE = "sglang_idle.py"  # a rolling switch's wait for in-flight requests (roles/router)
SCRIPTS = (PROBE, SMOKE, BENCH, IDLE)


def reads(bin_dir: str) -> list[Read]:
    """The paths :func:`install_check_scripts` manages, for the deploy's prefetch."""
    return [managed.read(bin_dir), *(managed.read(f"{bin_dir}/{s}") for s in SCRIPTS)]


@dataclass(frozen=True)
class SmokeRequest:
    """The smoke completion's request (sglang_smoke.py's arguments)."""

    port: int
    model: str
    max_tokens: int = 64
    config: str = ""


class SglangProbe(FactBase):
    """One probe of the unit (HTTP /health, systemd state, journal); JSON text. With
    ``wait`` the script waits on the host up to that many seconds for the server to
    become healthy or its start attempt to end (sglang_probe.py ``--wait``). With
    ``smoke``, a healthy server's probe line is followed by the smoke completion's."""

    def command(self, script: str, unit: str, port: int, wait: float = 0.0,
                smoke: SmokeRequest | None = None, only_profile: str = "") -> str:
        extra = ("--wait", f"{wait:.1f}") if wait > 0 else ()
        if smoke is not None:
            extra += ("--smoke-model", smoke.model, "--smoke-max-tokens",
                      str(smoke.max_tokens), "--smoke-config", smoke.config)
        probe = " ".join(shlex.quote(a) for a in (
            "python3", script, "--unit", unit, "--port", str(port), *extra))
        if not only_profile:
            return probe
        # exits 1 (the read is not kept) unless the live EnvironmentFile, where the
        # server's arguments are, names that profile
        return (f"grep -qxF -- {shlex.quote(profile_line(only_profile))} "
                f"{SERVICE_ENV_PATH} && {probe}")

    def process(self, output: list[str]) -> str:
        return "\n".join(output)


def serving_probe(script: str, unit: str, profile_name: str, smoke: SmokeRequest) -> Read:
    """The health gate's first probe, with its smoke completion, as a read of the
    deploy's first batch (deploy/serve.py ``role_reads``): a no-op rerun then proves
    health and a real completion without a command of its own (:func:`wait_healthy`
    uses it when no operation has changed the host and it says healthy). It runs only
    when the live EnvironmentFile serves ``profile_name``: a switch to another profile makes
    no completion on the server it is about to replace (a restart of the same profile,
    for a new lock or changed settings, still does, and the gate then probes again)."""
    return Read.of(SglangProbe, script=script, unit=unit, port=smoke.port, smoke=smoke,
                   only_profile=profile_name)


def serving_probe_read(inputs: ServeInput) -> Read | None:
    """The health gate's first probe with its smoke completion, as the deploy's checks
    will ask for it (roles/checks ``serving_probe``), derived from the host's parsed
    input before any host read, so that a rerun with nothing to do proves health and a
    completion in its first batch. None for a multi-node profile (only node 0 serves
    HTTP, which the plan decides once the host is read)."""
    profile, home = inputs.profile, inputs.settings.home
    if profile.parallel.nnodes > 1:
        return None
    smoke = SmokeRequest(port=profile.server.port,
                         model=profile.model.served_name or profile.model.path,
                         config=service.CONFIG_PATH if inputs.data["sglang_api_key"] else "")
    return serving_probe(f"{sglang.bin_dir(home)}/{PROBE}", service.UNIT_NAME,
                         profile.name, smoke)


class SglangSmoke(FactBase):
    """One completion request made on the host; JSON text. Reads, never changes state."""

    def command(self, script: str, port: int, model: str, max_tokens: int,
                config: str) -> str:
        return " ".join(shlex.quote(a) for a in (
            "python3", script, "--port", str(port), "--model", model,
            "--max-tokens", str(max_tokens), "--config", config))

    def process(self, output: list[str]) -> str:
        return "\n".join(output)



# A smoke completion the health gate's last probe already made (``SmokeRequest`` ->
# the smoke script's JSON line), per host, for :func:`smoke_completion` to judge.


def _smoke_seconds(smoke_line: str) -> float:
    """How long the smoke completion in a probe's output took (0 when unreadable: the
    smoke's own check reports that)."""
    try:
        return max(0.0, float(json.loads(smoke_line)["elapsed_s"]))
    except (ValueError, KeyError, TypeError):
        return 0.0


#: How old the first batch's probe may be for the gate to take it (seconds). On a
#: single host the gate runs within a second of the batch; across a fleet pyinfra runs
#: each operation on every host before the next, so a host's gate may come minutes
#: after its batch, and then it probes afresh.
BATCH_PROBE_MAX_AGE = 15.0


def _healthy_from_batch(text: str | None, smoke: SmokeRequest, timeout: float
                        ) -> tuple[Decision, list[str]] | None:
    """The batch's probe (:func:`serving_probe`) as the gate's verdict, when it found
    the server healthy and its smoke completion succeeded; None otherwise (the gate then
    probes afresh, so a stale or contended failure never fails or rolls back a host)."""
    probe_line, _, smoke_line = (text or "").partition("\n")
    if not smoke_line:
        return None
    try:
        probe = parse_probe(probe_line)
        parse_smoke_output(smoke_line)
    except (ProbeError, SmokeError):
        return None
    decision = decide(probe, 0.0, timeout, probe.n_restarts)
    if decision.verdict is not Verdict.HEALTHY:
        return None
    run_context().host(host.name).smoke = (smoke, smoke_line)
    return decision, probe.tail


def _gate(unit: str, port: int, script: str, timeout: float, interval: float,
          report_every: float, smoke: SmokeRequest | None = None
          ) -> tuple[Decision | None, list[str], float, str]:
    """Poll until healthy, dead or timed out: (decision, journal tail, seconds, error).

    A decision of None means the probe itself failed (``error`` says why). With
    ``smoke``, each probe asks the host for the smoke completion too once the server is
    healthy (one command and one Python start for both); a healthy verdict keeps it for
    :func:`smoke_completion`."""
    start = time.monotonic()
    last_report = -report_every
    last_phase = None
    baseline: int | None = None
    # the first probe waits on the host too (its NRestarts when it began is the baseline):
    # a server just restarted is rarely ready at once, and under TCG an answer that only
    # says "starting" cost a switch a round trip of about 3 s (two journalctl runs)
    wait = max(0.0, min(report_every, timeout))
    while True:
        asked = time.monotonic()
        text = host.get_fact(SglangProbe, script=script, unit=unit, port=port, wait=wait,
                             smoke=smoke)
        probe_line, _, smoke_line = (text or "").partition("\n")
        try:
            probe = parse_probe(probe_line)
        except ProbeError as e:
            return None, [], time.monotonic() - start, str(e)
        elapsed = time.monotonic() - start
        if baseline is None:
            baseline = (probe.restarts_before if probe.restarts_before is not None
                        else probe.n_restarts)
        decision = decide(probe, elapsed, timeout, baseline)
        if decision.verdict is Verdict.HEALTHY and smoke is not None and smoke_line:
            run_context().host(host.name).smoke = (smoke, smoke_line)
            elapsed = max(0.0, elapsed - _smoke_seconds(smoke_line))  # ready before it
        if decision.verdict is not Verdict.WAIT:
            return decision, probe.tail, elapsed, ""
        if decision.phase != last_phase or elapsed - last_report >= report_every:
            logger.info(progress_line(host.name, decision, elapsed))
            last_phase, last_report = decision.phase, elapsed
        if wait > 0 and time.monotonic() - asked < interval:
            time.sleep(interval)  # a waiting probe came back early without a verdict
        # the host waits for readiness (polling /health every 0.5 s), so the gate sees a
        # ready server at once; each wait ends in time for the next progress line
        wait = max(0.0, min(report_every, timeout - (time.monotonic() - start)))
        if wait == 0:
            time.sleep(interval)


@operation(is_idempotent=True)
def wait_healthy(unit: str, port: int, script: str, timeout: float, interval: float = 3.0,
                 report_every: float = 15.0, rollback: RollbackSpec | None = None,
                 smoke: SmokeRequest | None = None, profile_name: str = ""):
    """Wait for ``/health`` 200, printing the startup phase; fail early or on timeout.

    With ``rollback``, a failed gate first restores the last good configuration when
    there is one that differs from the failing one (roles/service/rollback.py), waits
    for it to be healthy again, and then fails the host saying so. With ``smoke``, the
    probe that finds the server healthy also makes the smoke completion (judged by
    :func:`smoke_completion`, the next operation). With ``profile_name`` too, and no
    operation of this deploy having changed the host, the first batch's probe of this
    profile (:func:`serving_probe`) stands for the first probe: the server it found
    healthy is the one this deploy leaves running."""
    if not state.is_executing:
        return
    run_context().host(host.name).smoke = None
    found = None
    if smoke is not None and profile_name and not changed_so_far():
        batch = prefetched(serving_probe(script, unit, profile_name, smoke),
                           max_age=BATCH_PROBE_MAX_AGE)
        found = _healthy_from_batch(batch, smoke, timeout)
    decision, tail, elapsed, error = ((*found, 0.0, "") if found else _gate(
        unit, port, script, timeout, interval, report_every, smoke))
    if decision is not None and decision.verdict is Verdict.HEALTHY:
        logger.info(f"{host.name}: health: ready after {elapsed:.0f} s ({decision.message})")
        # a crash systemd restarted is not a failed gate, but must not go unseen
        if decision.probe and (note := restart_warning(host.name, unit, decision.probe)):
            logger.warning(note)
        return
    reason = f"health: {error}" if decision is None else f"health: {decision.message}"
    if rollback is None:
        yield fail_host(reason + ("" if decision is None else
                              f"; last journal lines of {unit}:"), tail)
        return
    failed = f"{reason}; profile {rollback.profile_name} failed, last journal lines of {unit}:"
    outcome = yield from roll_back(rollback, port, script, timeout, interval, report_every,
                                   what="health")
    yield fail_host(failed, tail, outcome)


def roll_back(rollback: RollbackSpec, port: int, script: str, timeout: float,
              interval: float = 3.0, report_every: float = 15.0, what: str = "health"):
    """Restore the last good configuration when there is one that differs from the live
    one, and wait for it to be healthy. A generator for ``yield from`` inside an
    operation (it yields the restore command); returns the lines that end the report."""
    choice = rollback_decision(read_state(rollback))
    if choice.target is None:
        return [f"not rolled back: {choice.reason}"]
    logger.info(f"{host.name}: {what}: profile {rollback.profile_name} failed; "
                f"{choice.reason}")
    yield StringCommand("sh", "-c", QuoteString(restore_script(rollback)))
    after, after_tail, after_s, after_error = _gate(rollback.unit, port, script, timeout,
                                                    interval, report_every)
    if after is not None and after.verdict is Verdict.HEALTHY:
        return [rollback_outcome(rollback.profile_name, choice.target, after_s, None)]
    why = after_error if after is None else after.message
    return [rollback_outcome(rollback.profile_name, choice.target, after_s, why),
            *(f"    {line}" for line in after_tail)]


@operation(is_idempotent=True)
def smoke_completion(port: int, model: str, profile: str, script: str, config: str = "",
                     max_tokens: int = 64, record: RecordSpec | None = None):
    """One completion on the host; print ``<host>: smoke: N tokens in T s = X tok/s``
    and, with ``record``, write the result on the controller (no host command).

    The completion the health gate's probe made just before, for the same request, is
    judged instead of making another (:func:`wait_healthy` with ``smoke``)."""
    if not state.is_executing:
        return
    request = SmokeRequest(port=port, model=model, max_tokens=max_tokens, config=config)
    mine = run_context().host(host.name)
    made, mine.smoke = mine.smoke, None
    if made is not None and made[0] == request:
        out = made[1]
    else:
        out = host.get_fact(SglangSmoke, script=script, port=port, model=model,
                            max_tokens=max_tokens, config=config)
    try:
        result = parse_smoke_output(out)
    except SmokeError as e:
        yield fail_host(f"smoke: {e}", [])
        return
    logger.info(smoke_line(host.name, result, model, profile))
    if record is not None:
        try:
            path = write_record(results_root(record.results_dir),
                                smoke_record(record, host.name, result))
        except OSError as e:
            logger.warning(f"{host.name}: smoke: result not recorded: {e}")
        else:
            logger.info(f"{host.name}: smoke: recorded {path}")


@operation(is_idempotent=True)
def throughput_checks(plan: BenchPlan, script: str, record: RecordSpec | None,
                      rollback: RollbackSpec | None, health_script: str,
                      health_timeout: float, interval: float = 2.0,
                      report_every: float = 15.0):
    """Run the profile's scenarios with SGLang's client when the configuration is new to
    this host (or ``bench: always``), record them, and gate on them (docs/benchmarks.md,
    "gpuserve.roles.checks.bench: when, how and the gate")."""
    if not state.is_executing or plan.mode == "off":
        return
    if plan.mode == BenchMode.AUTO and fact_if_unchanged(BenchMark, path=plan.mark_path) == \
            plan.fingerprint:
        logger.info(f"{host.name}: bench: skipped, this configuration was measured and "
                    f"passed already (--data bench=always measures again)")
        return
    history = _results_for(record)
    yield StringCommand(f"install -d -m 755 {shlex.quote(plan.runs_dir)}")
    misses: list[str] = []
    checked: list[str] = []
    for scenario in plan.spec.scenarios:
        gate = yield from _bench_scenario(plan, scenario, script, history, record, interval,
                                          report_every)
        if gate is None:
            return  # the host failed (said why)
        checked += gate.checked
        misses += gate.misses
    for line in checked:
        logger.info(f"{host.name}: bench: ok: {line}")
    if not misses:
        yield _script_command(script, "mark", "--file", plan.mark_path, "--fingerprint",
                              plan.fingerprint, "--profile", plan.profile)
        return
    failed = (f"bench: profile {plan.profile} missed its throughput gate "
              f"(measured vs expected):")
    if plan.on_regression == OnRegression.ROLLBACK and rollback is not None:
        outcome = yield from roll_back(rollback, plan.port, health_script, health_timeout,
                                       what="bench")
    else:
        outcome = [f"not rolled back (on_regression: {plan.on_regression}): profile "
                   f"{plan.profile} keeps serving"]
    yield fail_host(failed, misses, outcome)


def _bench_scenario(plan: BenchPlan, scenario, script: str, history: list,
                    record: RecordSpec | None, interval: float, report_every: float):
    """One scenario of :func:`throughput_checks`: start SGLang's client on the host, poll
    it, judge and record its result. A generator for ``yield from`` inside the operation
    (it yields the host commands); returns the gate, or None after failing the host."""
    stamp = utc_now().replace("-", "").replace(":", "")
    run_dir = f"{plan.runs_dir}/{stamp}-{safe_name(plan.profile)}-{scenario.name}"
    argv = client_argv(scenario, port=plan.port, served_name=plan.served_name,
                       tokenizer=plan.tokenizer, output_file=f"{run_dir}/result.jsonl",
                       tag=f"{host.name}:{plan.profile}:{scenario.name}")
    logger.info(f"{host.name}: bench: {scenario.name}: {scenario.prompts} prompts "
                f"{scenario.input_len}/{scenario.output_len} tokens at concurrency "
                f"{scenario.concurrency} (SGLang's benchmark client, {run_dir})")
    yield _script_command(script, "start", "--run-dir", run_dir, "--user", plan.user,
                          "--python", plan.python, "--config", plan.config_path,
                          "--argv-json", json.dumps(argv))
    status, timed_out = _poll(script, run_dir, scenario, plan.spec.timeout_s, interval,
                              report_every)
    if timed_out:
        yield _script_command(script, "stop", "--run-dir", run_dir)
        yield fail_host(f"bench: {scenario.name} did not finish within "
                        f"{plan.spec.timeout_s:.0f} s (bench.timeout); stopped after "
                        f"{status.done}/{status.total or scenario.prompts} requests; the "
                        f"service keeps serving; run directory {run_dir}", [])
        return None
    if status.state != "done" or status.line is None:
        why = ("exited with status " + str(status.rc) if status.rc is not None
               else "ended without an exit status" if status.state == "failed"
               else "wrote no result line")
        yield fail_host(f"bench: {scenario.name}: SGLang's benchmark client {why}; "
                        f"last lines ({run_dir}):", status.tail)
        return None
    source = f"{host.name}:{run_dir}/result.jsonl"
    try:
        line = parse_sglang_line(status.line, source)
    except InputError as e:
        yield fail_host(f"bench: {scenario.name}: {e}", status.tail)
        return None
    before = last_good(history, host.name, plan.profile, scenario.name)
    gate = judge(plan.spec, scenario.name, line, before.figures if before else None,
                 f"last good ({before.timestamp})" if before else "last good")
    logger.info(result_line(host.name, scenario, line))
    _record_bench(record, scenario.name, line, gate)
    return gate


def _record_bench(record: RecordSpec | None, scenario: str, line: dict, gate) -> None:
    """Write one scenario's result as a record on the controller (a warning when it
    cannot be written: nothing measured fails the host for that)."""
    if record is not None:
        try:
            path = write_record(results_root(record.results_dir),
                                bench_record(record, host.name, scenario, line,
                                             gate.to_dict()))
        except (OSError, InputError) as e:
            logger.warning(f"{host.name}: bench: result not recorded: {e}")
        else:
            logger.info(f"{host.name}: bench: recorded {path}")


@deploy("Host scripts of the checks")
def install_check_scripts(bin_dir: str) -> None:
    """Upload the probe, smoke, benchmark and idle scripts (before the service changes:
    a rolling switch runs the idle wait before the restart)."""
    managed.directory(name=f"{bin_dir} (gpuserve host scripts)", path=bin_dir, user="root",
                      group="root", mode="755")
    for script in SCRIPTS:
        managed.put(name=f"host script {bin_dir}/{script}", src=str(SCRIPTS_DIR / script),
                    dest=f"{bin_dir}/{script}", user="root", group="root", mode="755")


@deploy("Check SGLang")
def check_service(unit: str, port: int, served_name: str, profile_name: str,
                  bin_dir: str, health_timeout: float, config_path: str = "",
                  record: RecordSpec | None = None,
                  rollback: RollbackSpec | None = None,
                  bench: BenchPlan | None = None, serves_http: bool = True) -> None:
    """Gate on health (the scripts: :func:`install_check_scripts`), then one smoke
    completion (recorded on the controller when ``record`` is given), then the
    throughput checks when ``bench`` is given (roles/checks/bench.py). With
    ``rollback``, a failed gate restores the last good configuration first (see
    :func:`wait_healthy`). ``serves_http`` False (a multi-node rank > 0): the gate
    waits for the unit to run, and nothing else runs."""
    if not serves_http:
        # a multi-node rank > 0: no HTTP here, so no smoke or throughput check either;
        # node 0's gate, smoke and checks cover the group
        wait_healthy(name=f"health gate: {unit} running (node serves no HTTP)", unit=unit,
                     port=0, script=f"{bin_dir}/{PROBE}", timeout=health_timeout,
                     rollback=rollback)
        return
    wait_healthy(name=f"health gate: {unit} answers /health 200",
                 unit=unit, port=port, script=f"{bin_dir}/{PROBE}", timeout=health_timeout,
                 rollback=rollback, smoke=SmokeRequest(port=port, model=served_name,
                                                       config=config_path),
                 profile_name=profile_name)
    smoke_completion(name=f"smoke completion on port {port}", port=port, model=served_name,
                     profile=profile_name, script=f"{bin_dir}/{SMOKE}", config=config_path,
                     record=record)
    if bench is not None and bench.mode != BenchMode.OFF:
        throughput_checks(name=f"throughput checks ({len(bench.spec.scenarios)} scenarios, "
                          f"SGLang's benchmark client)", plan=bench,
                          script=f"{bin_dir}/{BENCH}", record=record, rollback=rollback,
                          health_script=f"{bin_dir}/{PROBE}", health_timeout=health_timeout)
