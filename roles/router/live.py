"""A rolling switch judged by live traffic: after a switched worker is back in the
gateway, watch it under the gateway's real traffic against the workers not switched
yet; on a regression, take it out again, roll it back, put it back and stop the roll.

Why: a benchmark right after a switch is one load at one moment; the gateway's real
traffic shows a profile that is slower under it. The verdict is pure
(gpuserve/monitor/live_judge.py); this reads the workers' own ``/metrics`` through the
router host, twice a window apart, and acts on it.

How: docs/rolling-switch.md, "Judged by live traffic"
"""

from __future__ import annotations

import time

from pyinfra import host, logger, state
from pyinfra.api import operation
from pyinfra.api.exceptions import PyinfraError

from gpuserve.monitor.live_judge import (
    LiveKind,
    LiveSettings,
    Reads,
    Verdict,
    compare,
    next_read_in,
    parse_reads,
    read_command,
)
from gpuserve.poll import Poll
from gpuserve.roles.base.failure import fail_host
from gpuserve.roles.checks.rollback import roll_back
from gpuserve.roles.checks.scripts import PROBE
from gpuserve.roles.router.rolling import (
    Rollout,
    Switching,
    connected_router,
    execute_time_command,
    take_out_now,
)
from gpuserve.roles.service.rollback import RollbackSpec

#: a line while the window runs, this often (seconds)
PROGRESS_EVERY_S = 60


def _wait_window(host_name: str, seconds: float) -> None:
    """Sleep the window, with a progress line every minute of a long one."""
    for elapsed in Poll(float(seconds), PROGRESS_EVERY_S, clock=time.monotonic,
                        sleep=time.sleep):
        if 0 < elapsed < seconds:
            logger.info(f"{host_name}: live: {seconds - elapsed:.0f} s of the window left")


def read_workers(router, rollout: Rollout) -> Reads:
    """This worker's and the later workers' ``/metrics`` now, read on the router host."""
    urls = (rollout.url, *rollout.later)
    ok, output = router.run_shell_command(read_command(urls))
    at = time.monotonic()
    text = "\n".join(output.stdout_lines) if ok else ""
    if not ok:
        return Reads(at, {}, {u: f"reading /metrics on {rollout.router} failed: "
                              f"{' '.join(output.stderr_lines)[-200:]}" for u in urls})
    return parse_reads(text, urls, at)


def watch(host_name: str, rollout: Rollout, settings: LiveSettings) -> Verdict:
    """Read, wait the window, read again (and again, every few seconds, while either
    side has too few requests, up to ``max_wait_s``); the verdict."""
    if not rollout.later:
        return Verdict(LiveKind.UNJUDGED, f"{host_name}: the last worker of the roll: no host on "
                       "the previous profile left to compare with: not judged by live "
                       "traffic")
    try:
        router = connected_router(rollout)
        first = read_workers(router, rollout)
    except (PyinfraError, OSError) as exc:
        return Verdict(LiveKind.UNJUDGED, f"{host_name}: the router host {rollout.router} could "
                       f"not be reached ({exc}): not judged by live traffic")
    if rollout.url not in first.snapshots:
        return compare(host_name, rollout.url, rollout.later, first, first, settings, 0)[0]
    logger.info(f"{host_name}: live: watching {rollout.url} under the gateway's traffic for "
                f"{settings.window_s} s against {', '.join(rollout.later)} (not switched yet)")
    _wait_window(host_name, settings.window_s)
    rounds = Poll(settings.max_wait_s, 1.0, clock=time.monotonic, sleep=time.sleep)
    for _ in rounds:
        last = read_workers(router, rollout)
        waited = max(0.0, last.at - first.at - settings.window_s)
        verdict, notes = compare(host_name, rollout.url, rollout.later, first, last,
                                 settings, waited)
        for note in notes:
            logger.warning(f"{host_name}: live: {note}")
        if verdict.kind != LiveKind.WAIT:
            return verdict
        logger.info(f"{verdict.message} (waited {waited:.0f} of {settings.max_wait_s} s)")
        rounds.next_s = next_read_in(settings, waited)
    return compare(host_name, rollout.url, rollout.later, first, last, settings,
                   max(waited, float(settings.max_wait_s)))[0]


@operation(is_idempotent=True)
def judge_live(rollout: Rollout, switching: Switching, settings: LiveSettings | None,
               bin_dir: str, port: int, config: str, rollback: RollbackSpec,
               health_timeout: float):
    """After the put-back: the live verdict. A pass or no verdict (too little traffic,
    nothing to compare with, unreadable metrics) goes on, saying which; a regression
    takes the worker out again, restores its last good configuration, puts it back
    (the take-out's failure hook, once it is healthy) and fails the host, so the
    rollout stops."""
    if not state.is_executing or settings is None or switching.gateway_stopped:
        return
    verdict = watch(host.name, rollout, settings)
    if verdict.kind == LiveKind.PASS:
        logger.info(f"{verdict.message}")
        return
    if verdict.kind != LiveKind.REGRESSION:
        logger.warning(f"{verdict.message}")
        return
    logger.error(f"{host.name}: live: regression: {verdict.message}; taking it out of the "
                 "gateway again to roll it back")
    # drained like any take-out; its failure hook puts the worker back once it serves
    # its last good configuration again
    kept = (f"live traffic: {verdict.message}; not rolled back, {host.name} keeps serving "
            f"profile {rollback.profile_name}: roll it back with a serve deploy of the "
            "previous profile")
    yield execute_time_command(take_out_now, rollout, switching, bin_dir, port, config, kept)
    outcome = yield from roll_back(rollback, port, f"{bin_dir}/{PROBE}", health_timeout,
                                   what="live")
    yield fail_host(f"rolling switch: live traffic: {verdict.message}; profile "
                    f"{rollback.profile_name} is rolled back on {host.name} and the rolling "
                    "switch stops here", [], outcome)
