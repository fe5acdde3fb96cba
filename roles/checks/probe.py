"""The health probe: the server's /health (and its smoke completion) read as a fact,
from the deploy's first batch when it is fresh, else polled until a verdict.
"""

from __future__ import annotations

import shlex

from pyinfra import host, logger
from pyinfra.api import FactBase

from gpuserve.measure.health import (
    Decision,
    ProbeError,
    Verdict,
    decide,
    parse_probe,
    progress_line,
)
from gpuserve.measure.smoke import SmokeError, parse_smoke_output, same_start
from gpuserve.plans.serve import FirstReads
from gpuserve.poll import Poll
from gpuserve.roles.base.prefetch import Read
from gpuserve.roles.base.run_context import run_context
from gpuserve.roles.checks.scripts import PROBE
from gpuserve.roles.checks.smoke import SmokeRequest, smoke_seconds, smoked_start
from gpuserve.serve import install as sglang
from gpuserve.serve import service
from gpuserve.serve.render import SERVICE_ENV_PATH, profile_line


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
            if smoke.unless_start:
                extra += ("--smoke-unless-start", smoke.unless_start)
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


def serving_probe_read(first: FirstReads, host_name: str) -> Read | None:
    """The health gate's first probe with its smoke completion, as the deploy's checks
    will ask for it (roles/checks ``serving_probe``), from what the host's parsed input
    tells before any host read (gpuserve/plans/serve.first_reads), so that a rerun with
    nothing to do proves health and a completion in its first batch. None for a
    multi-node profile (only node 0 serves HTTP, which the plan decides once the host is
    read). Its smoke is asked unless the start of ``host_name``'s newest smoke record
    still runs (roles/checks/smoke.py; only when the server makes one smoke per start)."""
    probe = first.probe
    if probe is None:
        return None
    smoke = SmokeRequest(port=probe.port, model=probe.served_name, config=probe.config_path,
                         unless_start=smoked_start(probe.smoke_records, host_name))
    return serving_probe(f"{sglang.bin_dir(first.home)}/{PROBE}", service.UNIT_NAME,
                         probe.profile_name, smoke)


#: How old the first batch's probe may be for the gate to take it (seconds). On a
#: single host the gate runs within a second of the batch; across a fleet pyinfra runs
#: each operation on every host before the next, so a host's gate may come minutes
#: after its batch, and then it probes afresh.
BATCH_PROBE_MAX_AGE = 15.0


def healthy_from_batch(text: str | None, smoke: SmokeRequest, timeout: float
                        ) -> tuple[Decision, list[str]] | None:
    """The batch's probe (:func:`serving_probe`) as the gate's verdict, when it found
    the server healthy and its smoke completion succeeded; None otherwise (the gate then
    probes afresh, so a stale or contended failure never fails or rolls back a host)."""
    probe_line, _, smoke_line = (text or "").partition("\n")
    if not smoke_line:
        return None
    try:
        probe = parse_probe(probe_line)
        if not smoke.unless_start or same_start(smoke_line) != smoke.unless_start:
            parse_smoke_output(smoke_line)
    except (ProbeError, SmokeError):
        return None
    decision = decide(probe, 0.0, timeout, probe.n_restarts)
    if decision.verdict is not Verdict.HEALTHY:
        return None
    run_context().host(host.name).smoke = (smoke, smoke_line)
    return decision, probe.tail


def poll_health(unit: str, port: int, script: str, timeout: float, interval: float,
          report_every: float, smoke: SmokeRequest | None = None
          ) -> tuple[Decision | None, list[str], float, str]:
    """Poll until healthy, dead or timed out: (decision, journal tail, seconds, error).

    A decision of None means the probe itself failed (``error`` says why). With
    ``smoke``, each probe asks the host for the smoke completion too once the server is
    healthy (one command and one Python start for both); a healthy verdict keeps it for
    :func:`smoke_completion`."""
    last_report = -report_every
    last_phase = None
    baseline: int | None = None
    # the first probe waits on the host too (its NRestarts when it began is the baseline):
    # a server just restarted is rarely ready at once, and under TCG an answer that only
    # says "starting" cost a switch a round trip of about 3 s (two journalctl runs).
    # The host waits for readiness (polling /health every 0.5 s), so the gate sees a
    # ready server at once; each wait ends in time for the next progress line, and a
    # waiting probe that came back early without a verdict is paced by the poll.
    rounds = Poll(timeout, interval)
    start = rounds.clock()
    for _ in rounds:
        wait = max(0.0, min(report_every, timeout - (rounds.clock() - start)))
        text = host.get_fact(SglangProbe, script=script, unit=unit, port=port, wait=wait,
                             smoke=smoke)
        probe_line, _, smoke_line = (text or "").partition("\n")
        try:
            probe = parse_probe(probe_line)
        except ProbeError as e:
            return None, [], rounds.clock() - start, str(e)
        elapsed = rounds.clock() - start
        if baseline is None:
            baseline = (probe.restarts_before if probe.restarts_before is not None
                        else probe.n_restarts)
        decision = decide(probe, elapsed, timeout, baseline)
        if decision.verdict is Verdict.HEALTHY and smoke is not None and smoke_line:
            run_context().host(host.name).smoke = (smoke, smoke_line)
            elapsed = max(0.0, elapsed - smoke_seconds(smoke_line))  # ready before it
        if decision.verdict is not Verdict.WAIT:
            return decision, probe.tail, elapsed, ""
        if decision.phase != last_phase or elapsed - last_report >= report_every:
            logger.info(progress_line(host.name, decision, elapsed))
            last_phase, last_report = decision.phase, elapsed
    # the poll's count bound ended it first: the timeout's verdict
    return decide(probe, max(elapsed, timeout), timeout, baseline), probe.tail, elapsed, ""
