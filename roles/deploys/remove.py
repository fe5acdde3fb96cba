"""The remove deploy: gpuserve's server and gateway taken off the host, records and
weights kept (``remove_weights=true`` takes the weights too). Called by
deploy/remove.py, or by a pyinfra project's own deploy file. What goes and what stays:
gpuserve/plans/removal.py and docs/operate.md.
"""

from __future__ import annotations

from pyinfra import host, inventory, logger
from pyinfra.operations import python

from gpuserve.measure.results import utc_now
from gpuserve.monitor.removed import mark_removed, marked_since_last_record, removed_marker
from gpuserve.operate.monitor_note import MONITOR_GROUP, monitor_note
from gpuserve.plans.removal import plan_removal
from gpuserve.roles import remove as remove_role
from gpuserve.roles.base.inventory import inventory_source, packaged_deploy


@packaged_deploy
def remove_gpuserve() -> None:
    """Stop and remove the SGLang service and the gateway (units, env files, configs,
    secrets, venvs, host scripts, last good copies); idempotent; bad host data stops
    the host before any operation. Keys: ``gpuserve.roles.remove.DEFAULTS`` and the
    homes of the serve and gateway deploys (``sglang_home``, ``router_home``,
    ``models_dir``)."""
    plan = plan_removal(host.data.dict(), inventory_source())
    marker = removed_marker(host.name, host.data.dict(), inventory_source())
    monitors = [h.name for h in inventory.get_group(MONITOR_GROUP, default=None) or []]
    note = monitor_note(host.name, host.data.dict(), monitors, inventory_source(),
                        marked=marker is not None)
    if note:
        logger.warning(note)
    remove_role.remove_installation(plan=plan)
    if marker is not None and host.data.get("profile") and not marked_since_last_record(marker):
        python.call(name=f"mark {host.name} removed for the monitor's plan ({marker})",
                    function=lambda: mark_removed(marker, utc_now()))
