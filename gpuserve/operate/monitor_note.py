"""What the remove deploy says about the monitor: a removed host stays a scrape target.

Why: the monitor's targets come from the inventory (gpuserve/monitor/targets.py), not
from the hosts, so a host whose server was removed is still scraped, its SGLang target
goes down and SGLangServerDown fires. The remove deploy runs on the removed host only
and cannot rewrite the monitor host's targets; it says, before any change, how to take
the host out (the inventory, then the monitor deploy on the monitor hosts) and how to
silence the alert meanwhile. Pure. How: docs/operate.md, "deploy/remove.py".
"""

from __future__ import annotations

from gpuserve.monitor.host_plan import MONITOR_GROUP
from gpuserve.plans.router import is_router_host


def monitor_note(name: str, data: dict, monitor_hosts: list[str], source: str) -> str | None:
    """One line for a removed host the inventory's monitor still scrapes; None when the
    inventory has no monitor group or the host exports nothing to it."""
    if not monitor_hosts or not (data.get("profile") or is_router_host(data)):
        return None
    what = "its SGLang target" if data.get("profile") else "its gateway's target"
    return (f"{name}: still scraped by the monitor on {', '.join(monitor_hosts)}: {what} "
            f"goes down and SGLangServerDown fires; to take it out of monitoring, remove "
            f"{name} (or its profile) from {source}, then run: pyinfra -y {source} "
            f"deploy/monitor.py --limit {MONITOR_GROUP} (meanwhile: amtool silence add "
            f"host={name}, or the Prometheus alert view)")
