"""What a host runs: the profile, its launch hash and since when, as the host records it.

Why: the inventory is the desired state; a switch with ``--data profile=P`` runs P
without the inventory saying so. Every view (``gpuserve render --limit``, ``gpuserve
logs``, ``fleet status``, the monitor's ``profile`` label) shows what runs and marks a
difference from the inventory, and a plain deploy that would switch back says so first.

The serve deploy writes :data:`RUNNING_PATH` (mode 0644: names and hashes, no secret)
after the health gate and smoke pass (roles/service/running.py); a deploy whose gate
fails rolls back to the last good configuration, which is the one the record names.
Views without SSH (fleet status, the monitor's targets) read the same facts from the
records the deploy writes on the controller at the same moment (:func:`running_of_records`).
Pure: texts and records in, lines out. How: docs/deploys.md, "The inventory is the
desired state".
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

RUNNING_PATH = "/etc/gpuserve/running.json"
SCHEMA = "gpuserve.running/1"


@dataclass(frozen=True)
class Running:
    """The profile a host runs, its launch hash and when the deploy proved it."""

    profile: str
    launch_hash: str | None = None
    since: str | None = None
    source: str = "host"  # "host": RUNNING_PATH; "records": the controller's results

    def to_dict(self) -> dict:
        return {"profile": self.profile, "launch_hash": self.launch_hash,
                "since": self.since, "source": self.source}

    def short(self) -> str:
        """``P since T (launch sha256:abcdef012345)`` for one line."""
        text = self.profile + (f" since {self.since}" if self.since else "")
        if self.launch_hash:
            text += f" (launch {self.launch_hash[:19]})"
        return text


def record_text(running: Running) -> str:
    """The file's text: one JSON line."""
    return json.dumps({"schema": SCHEMA, "profile": running.profile,
                       "launch_hash": running.launch_hash, "since": running.since},
                      separators=(",", ":")) + "\n"


def parse_running(lines: Iterable[str] | str | None) -> Running | None:
    """:data:`RUNNING_PATH`'s text (lines as pyinfra's FileContents gives them); None
    when absent, unreadable or of another schema (a record is a hint, never an error)."""
    if lines is None:
        return None
    text = lines if isinstance(lines, str) else "\n".join(lines)
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return None
    profile = doc.get("profile")
    if not isinstance(profile, str) or not profile:
        return None
    launch, since = doc.get("launch_hash"), doc.get("since")
    return Running(profile, launch if isinstance(launch, str) else None,
                   since if isinstance(since, str) else None)


def from_dict(doc: object) -> Running | None:
    """A :meth:`Running.to_dict` document back (read-only runs' JSON); None otherwise."""
    if not isinstance(doc, dict) or not isinstance(doc.get("profile"), str):
        return None
    return Running(doc["profile"], doc.get("launch_hash"), doc.get("since"),
                   str(doc.get("source") or "host"))


def same_launch(running: Running | None, profile: str, launch: str | None) -> bool:
    """Whether the record already names this profile and launch (nothing to write)."""
    return (running is not None and running.profile == profile
            and running.launch_hash == launch)


def running_of_records(records: Iterable, host: str) -> Running | None:
    """The controller's view: the newest record of ``host`` whose launch passed (smoke,
    or a bench whose gate did not fail), skipping a launch whose newest record failed
    its gate (that deploy rolled back). ``records``: gpuserve.measure ResultRecords."""
    mine = [r for r in records if (r.host in (None, host)) and r.profile]
    mine.sort(key=lambda r: r.timestamp or "")
    failed: set[str | None] = set()
    for record in reversed(mine):
        if not record.is_good:
            failed.add(record.launch_hash)
            continue
        if record.launch_hash in failed and record.launch_hash is not None:
            continue
        return Running(record.profile, record.launch_hash, record.timestamp, "records")
    return None


def difference(running: Running | None, desired: str | None) -> str | None:
    """The words for a host that runs another profile than the inventory names; None
    when they agree or either is unknown."""
    if running is None or not desired or running.profile == desired:
        return None
    return (f"runs {running.profile}, the inventory names {desired}: a plain deploy "
            f"switches it to {desired} (to keep {running.profile}, set profile: "
            f"{running.profile} in the inventory)")


def switch_note(host: str, running: Running | None, planned: str,
                inventory_profile: str | None, overridden: bool) -> str | None:
    """The deploy's first line when it switches profiles, in plain words; None when it
    serves what runs already (or nothing is recorded yet). ``overridden``: host data
    ``profile`` came from ``--data``; ``inventory_profile``: the inventory's own."""
    if running is None or running.profile == planned:
        return None
    since = f" since {running.since}" if running.since else ""
    if overridden:
        keep = (f"; the inventory names {inventory_profile}, so a plain deploy would switch "
                f"back: set profile: {planned} in the inventory to keep it"
                if inventory_profile and inventory_profile != planned else "")
        return (f"{host}: switches from {running.profile} (running{since}) to {planned} "
                f"(--data profile={planned}){keep}")
    return (f"{host}: switches from {running.profile} (running{since}) to {planned}, the "
            f"profile the inventory names (the desired state); to keep {running.profile}, "
            f"set profile: {running.profile} in the inventory")
