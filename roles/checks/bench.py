"""Throughput checks after the health gate: SGLang's own benchmark client, per scenario,
recorded on the controller and gated.

Why this shape: a benchmark takes minutes, so it runs only when the served configuration
differs from the one the host last passed (its mark), runs in the background on the host
while the deploy polls it and prints progress, and every finished run is recorded, even
one that fails its gate: nothing measured is lost.

How: docs/benchmarks.md, "gpuserve.roles.checks.bench: when, how and the gate"
"""

from __future__ import annotations

import json
import shlex

from pyinfra import host, logger, state
from pyinfra.api import FactBase, StringCommand, operation

from gpuserve.errors import InputError
from gpuserve.facts.base import print_file
from gpuserve.launch.bench import (
    BenchMode,
    OnRegression,
    RunState,
    RunStatus,
    Scenario,
    client_argv,
    judge,
    parse_status,
    progress_line,
    result_line,
)
from gpuserve.measure.results import (
    RecordSpec,
    bench_record,
    last_good,
    parse_sglang_line,
    read_results,
    safe_name,
    utc_now,
    write_record,
)
from gpuserve.poll import JOB_FIRST_PAUSES_S, Poll
from gpuserve.roles.base.failure import fail_host
from gpuserve.roles.base.prefetch import Read, fact_if_unchanged
from gpuserve.roles.checks.rollback import roll_back
from gpuserve.roles.service.rollback import (
    RollbackSpec,
)
from gpuserve.serve.checks import (
    BenchPlan,
    mark_path,
    results_root,
)


class BenchMark(FactBase):
    """The configuration the host last measured and passed (``fingerprint``), or None."""

    def command(self, path: str) -> str:
        return f"{print_file(shlex.quote(path))} || true"

    def process(self, output: list[str]) -> str | None:
        try:
            doc = json.loads("\n".join(output))
        except json.JSONDecodeError:
            return None
        return doc.get("fingerprint") if isinstance(doc, dict) else None


class BenchStatus(FactBase):
    """One ``sglang_bench.py status`` report (JSON text); a read."""

    def command(self, script: str, run_dir: str) -> str:
        return " ".join(shlex.quote(a) for a in ("python3", script, "status", "--run-dir",
                                                 run_dir))

    def process(self, output: list[str]) -> str:
        return "\n".join(output)


def _script_command(script: str, *args: str) -> StringCommand:
    return StringCommand(" ".join(shlex.quote(a) for a in ("python3", script, *args)))


def _results_for(record: RecordSpec | None) -> list:
    if record is None:
        return []
    directory = results_root(record.results_dir) / safe_name(host.name)
    if not directory.is_dir():
        return []
    try:
        return read_results(directory)
    except InputError as e:
        logger.warning(f"{host.name}: bench: earlier records not read ({e}); no regression "
                       "baseline")
        return []


def _poll(script: str, run_dir: str, scenario: Scenario, timeout: float, interval: float,
          report_every: float) -> tuple[RunStatus, bool]:
    """Poll until the run ends or ``timeout`` passes: (last status, timed out)."""
    last_report, last_done = -report_every, -1
    for elapsed in Poll(timeout, interval, first_s=JOB_FIRST_PAUSES_S):
        status = parse_status(host.get_fact(BenchStatus, script=script, run_dir=run_dir))
        if status.state != RunState.RUNNING:
            return status, False
        if elapsed - last_report >= report_every or (
                status.done != last_done and elapsed - last_report >= report_every / 3):
            logger.info(progress_line(host.name, scenario, status))
            last_report, last_done = elapsed, status.done
    return status, True


def reads(home: str) -> list[Read]:
    """What :func:`throughput_checks` reads before deciding to run, for the prefetch."""
    return [Read.of(BenchMark, path=mark_path(home))]


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
    if status.state != RunState.DONE or status.line is None:
        why = ("exited with status " + str(status.rc) if status.rc is not None
               else "ended without an exit status" if status.state == RunState.FAILED
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
