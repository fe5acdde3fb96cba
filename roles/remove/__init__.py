"""Take gpuserve's server and gateway off a host: units, env files, configs, venvs.

What is removed and what is kept is decided in ``gpuserve/plans/removal.py``; here one
prefetched read (every path's state, both units') decides which operations exist at
all, so a rerun on a clean host has none ("No changes") and ``--dry`` lists exactly
the ones that would run, each named by what it removes.
"""

from __future__ import annotations

import shlex

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.operations import server

from gpuserve.plans.removal import RemovalPlan
from gpuserve.roles.base import managed
from gpuserve.roles.base.prefetch import Read, prefetch

__all__ = ["reads", "remove_installation"]

#: Unit states in which the unit still has to be stopped.
RUNNING = ("active", "activating", "reloading", "deactivating", "failed")


def reads(plan: RemovalPlan) -> list[Read]:
    """Every path and unit state the removal reads, for one prefetch."""
    paths = [t.path for t in (*plan.files, *plan.directories)]
    return [*(managed.read(p) for p in paths),
            *(managed.read_unit(unit) for unit, _ in plan.units)]


def _present(path: str) -> bool:
    return managed.state(path).kind != "absent"


def _shell(name: str, command: str) -> None:
    """One removal step; said at prepare time too, so that ``-y --dry`` (which skips
    pyinfra's change detection) still lists every step."""
    logger.info(f"{host.name}: remove: {name}")
    server.shell(name=name, commands=[command])


@deploy("Remove gpuserve")
def remove_installation(plan: RemovalPlan) -> None:
    """Stop and disable each unit that exists, delete each path that exists, then let
    systemd forget the removed units."""
    prefetch(reads(plan))
    removed_units = []
    for unit, path in plan.units:
        live = managed.unit_state(unit)
        if _present(path) or live.active in RUNNING or live.enabled not in ("", "not-found"):
            q = shlex.quote(unit)
            _shell(f"stop and disable {unit}", f"systemctl disable --now {q} 2>/dev/null || "
                   f"systemctl stop {q}; systemctl reset-failed {q} 2>/dev/null || true")
            removed_units.append(unit)
    for target in plan.files:
        if _present(target.path):
            _shell(f"remove {target.path} ({target.what})",
                   f"rm -f -- {shlex.quote(target.path)}")
    for target in plan.directories:
        if _present(target.path):
            _shell(f"remove {target.path}/ ({target.what})",
                   f"rm -rf -- {shlex.quote(target.path)}")
    if removed_units:
        _shell("systemctl daemon-reload (the removed units are forgotten)",
               "systemctl daemon-reload")
    if not removed_units and not any(_present(t.path) for t in (*plan.files,
                                                                 *plan.directories)):
        logger.info(f"{host.name}: remove: nothing of gpuserve's server or gateway is left")
    for line in plan.kept:
        logger.info(f"{host.name}: remove: kept {line}")
