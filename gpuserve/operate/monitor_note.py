"""A removed host and the monitor: its SGLang target leaves the monitor's plan.

Why: the monitor's targets come from the inventory (gpuserve/monitor/targets.py), so a
host whose server was removed stayed a target, its SGLang target went down and
SGLangServerDown fired. The remove deploy marks the host removed in the controller's
results directory (``results/<host>/.removed``, the time; the records stay), and the
monitor plan leaves out the SGLang target of a host marked removed after its last
record (its node and DCGM exporters stay); a serve deploy's next record brings it back.
The remove deploy runs on the removed host only, so it says, before any change, that
the monitor deploy's next run drops the target and how to silence the alert until then.
The marker: gpuserve/monitor/removed.py. Pure. How: docs/operate.md, "deploy/remove.py".
"""

from __future__ import annotations

from gpuserve.monitor.host_plan import MONITOR_GROUP


def monitor_note(name: str, data: dict, monitor_hosts: list[str], source: str,
                 marked: bool) -> str | None:
    """One line for a removed host the inventory's monitor scrapes; None when the
    inventory has no monitor group or the host serves nothing it scrapes.
    ``marked``: the results directory takes the marker (recording on)."""
    if not monitor_hosts or not data.get("profile"):
        return None
    where = ", ".join(monitor_hosts)
    silence = f"until then SGLangServerDown fires for host={name}: silence it there"
    if marked:
        return (f"{name}: leaves the monitor's plan (marked removed in its results "
                f"directory): pyinfra -y {source} deploy/monitor.py --limit {MONITOR_GROUP} "
                f"drops its SGLang target on {where} (node and DCGM stay); {silence}")
    return (f"{name}: still scraped by the monitor on {where} (recording is off, so it "
            f"cannot be marked removed): remove its profile from {source}, then run "
            f"pyinfra -y {source} deploy/monitor.py --limit {MONITOR_GROUP}; {silence}")

