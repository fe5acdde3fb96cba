"""The checks' rollback: restore the last good configuration and wait for it to be
healthy (after a failed health gate or a missed throughput gate).
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import QuoteString, StringCommand

from gpuserve.measure.health import (
    Verdict,
)
from gpuserve.roles.checks.probe import poll_health
from gpuserve.roles.service.rollback import (
    RollbackSpec,
    read_state,
    restore_script,
    rollback_decision,
    rollback_outcome,
)


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
    after, after_tail, after_s, after_error = poll_health(rollback.unit, port, script, timeout,
                                                    interval, report_every)
    if after is not None and after.verdict is Verdict.HEALTHY:
        return [rollback_outcome(rollback.profile_name, choice.target, after_s, None)]
    why = after_error if after is None else after.message
    return [rollback_outcome(rollback.profile_name, choice.target, after_s, why),
            *(f"    {line}" for line in after_tail)]
