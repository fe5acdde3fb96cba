"""The health gate: wait until the restarted server is healthy; on failure, roll back
to the last good configuration (roles/checks/rollback.py) and fail the host.
"""

from __future__ import annotations

from pyinfra import host, logger, state
from pyinfra.api import operation

from gpuserve.measure.health import (
    Verdict,
    restart_warning,
)
from gpuserve.measure.starts import StartSpec
from gpuserve.roles.base.failure import fail_host
from gpuserve.roles.base.prefetch import changed_so_far, prefetched
from gpuserve.roles.base.run_context import run_context
from gpuserve.roles.checks.probe import (
    BATCH_PROBE_MAX_AGE,
    healthy_from_batch,
    poll_health,
    serving_probe,
)
from gpuserve.roles.checks.rollback import roll_back
from gpuserve.roles.checks.smoke import SmokeRequest
from gpuserve.roles.checks.starts import record_start
from gpuserve.roles.service.rollback import (
    RollbackSpec,
)

#: The gate's pace: a probe at least this often (s), a progress line this often (s).
INTERVAL_S, REPORT_EVERY_S = 3.0, 15.0


@operation(is_idempotent=True)
def wait_healthy(unit: str, port: int, script: str, timeout: float,
                 rollback: RollbackSpec | None = None, smoke: SmokeRequest | None = None,
                 start: StartSpec | None = None):
    """Wait for ``/health`` 200, printing the startup phase; fail early or on timeout.

    With ``rollback``, a failed gate first restores the last good configuration when
    there is one that differs from the failing one (roles/service/rollback.py), waits
    for it to be healthy again, and then fails the host saying so. With ``smoke``, the
    probe that finds the server healthy also makes the smoke completion (judged by
    :func:`smoke_completion`, the next operation). With the smoke's ``profile`` too, and
    no operation of this deploy having changed the host, the first batch's probe of this
    profile (:func:`serving_probe`) stands for the first probe: the server it found
    healthy is the one this deploy leaves running. With ``start``, the memory figures of
    a start this deploy made are recorded on the controller, healthy or not
    (roles/checks/starts.py)."""
    if not state.is_executing:
        return
    run_context().host(host.name).smoke = None
    found = None
    if smoke is not None and smoke.profile and not changed_so_far():
        batch = prefetched(serving_probe(script, unit, smoke.profile, smoke),
                           max_age=BATCH_PROBE_MAX_AGE)
        found = healthy_from_batch(batch, smoke, timeout)
    decision, tail, elapsed, error = ((*found, 0.0, "") if found else poll_health(
        unit, port, script, timeout, INTERVAL_S, REPORT_EVERY_S, smoke))
    if found is None and changed_so_far():
        record_start(start, unit)
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
    outcome = yield from roll_back(rollback, port, script, timeout, INTERVAL_S, REPORT_EVERY_S,
                                   what="health")
    yield fail_host(failed, tail, outcome)
