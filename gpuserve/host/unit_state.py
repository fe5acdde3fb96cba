"""The serve unit's live state: is it running what its files say?

Input: ``systemctl show --timestamp=us+utc -p ActiveState -p UnitFileState -p
NeedDaemonReload -p ExecMainStartTimestamp`` (``Key=value`` lines, systemd.exec(5) /
org.freedesktop.systemd1(5); the main process's start as ``Wed 2026-12-02 00:59:34.123456
UTC``), plus, when the start is in any other form (systemd before v251 prints local
time to the second), ``Started=<epoch>`` (that value through ``date +%s.%N``);
then one ``Mtime=<epoch> <path>`` per file (``stat -c %.9Y``), as
``roles.base.managed.UnitState`` prints them.

Why the times: a deploy cut off after writing a file and before restarting the server
(an SSH drop, a killed controller) leaves the new file in place; the rerun then finds
every file as wanted, and without comparing times it would leave the server on the old
configuration for good.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime


@dataclass(frozen=True)
class LiveUnit:
    active: str = ""  # ActiveState: active, inactive, failed, activating ...
    enabled: str = ""  # UnitFileState: enabled, disabled, "" when the unit is unknown
    need_reload: bool = False  # NeedDaemonReload: the file changed since systemd read it
    newer: tuple[str, ...] = ()  # files written after the running server started

    @property
    def stale(self) -> bool:
        """The server runs an older configuration than its files."""
        return bool(self.newer) and self.active in ("active", "activating", "reloading")

    @property
    def converged(self) -> bool:
        """Active, enabled, systemd has the unit file, and started after every file."""
        return (self.active == "active" and self.enabled == "enabled"
                and not self.need_reload and not self.stale)


def parse_unit_state(lines: list[str]) -> LiveUnit:
    """Parse the lines described in the module docstring; unknown lines are ignored.

    A start time with no fraction (systemd before v247 has no ``--timestamp=``) is
    only good to the second, so a file counts as newer only from the next second on:
    a rerun must never restart a model server (minutes of loading) on a guess."""
    keys: dict[str, str] = {}
    started: float | None = None
    whole_seconds = False
    mtimes: list[tuple[float, str]] = []
    for line in lines:
        key, sep, value = line.strip().partition("=")
        if not sep:
            continue
        if key == "Started":
            try:
                started = float(value)
            except ValueError:
                started = None
            whole_seconds = value.endswith(".000000000") or "." not in value
        elif key == "ExecMainStartTimestamp":
            # a form utc_timestamp cannot read comes with a Started= line (through date)
            started = utc_timestamp(value) if started is None else started
        elif key == "Mtime":
            stamp, _, path = value.partition(" ")
            try:
                mtimes.append((float(stamp), path))
            except ValueError:
                continue
        else:
            keys[key] = value
    newer: tuple[str, ...] = ()
    if started is not None and started > 0:
        bar = started + 1 if whole_seconds else started
        newer = tuple(path for stamp, path in mtimes if stamp > bar)
    return LiveUnit(active=keys.get("ActiveState", ""),
                    enabled=keys.get("UnitFileState", ""),
                    need_reload=keys.get("NeedDaemonReload", "no") == "yes",
                    newer=newer)


def utc_timestamp(value: str) -> float | None:
    """``Wed 2026-12-02 00:59:34.123456 UTC`` (``systemctl show --timestamp=us+utc``) as
    epoch seconds; None when empty (never started) or in any other form. The weekday is
    skipped: systemd prints it with strftime's ``%a``, in the host's locale."""
    found = _UTC_STAMP.search(value)
    if not found:
        return None
    try:
        when = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S.%f")
    except ValueError:
        return None
    return when.replace(tzinfo=UTC).timestamp()


_UTC_STAMP = re.compile(r"(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{6}) UTC$")
