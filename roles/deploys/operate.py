"""Read-only deploys behind ``gpuserve render INVENTORY --limit HOST`` and ``gpuserve logs``.

``serve_launch()`` plans the host exactly as the serve deploy does (``plan_and_read``:
host data, records, the lock, the preflight) and writes the launch the unit would run
(gpuserve/serve/launch_view.py) to the controller. ``service_journal()`` writes the
serve unit's journal: the window asked for and the last start, with every secret of the
host's data masked. Neither yields an operation: the host is not changed, and pyinfra
says "No changes". The controller path comes in host data ``operate_snapshot`` (set by
the commands for their run, never in an inventory); the file is 0600.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

from pyinfra import host, state
from pyinfra.api import FactBase
from pyinfra.facts.files import FileContents

from gpuserve.errors import InputError
from gpuserve.host.nccl_env import NCCL_ENV_PATH
from gpuserve.launch.secrets import host_secret_values
from gpuserve.measure.results import utc_now
from gpuserve.redact import redact
from gpuserve.roles.base.inventory import inventory_source, packaged_deploy
from gpuserve.roles.base.prefetch import fact
from gpuserve.roles.deploys.serve import plan_and_read
from gpuserve.roles.service.running import read_running
from gpuserve.serve.launch_view import launch_view
from gpuserve.serve.service import UNIT_NAME

JOURNAL_SCHEMA = "gpuserve.service-journal/1"
#: Lines read for the last start's diagnosis (the tune reads as many).
START_LINES = 4000
#: The most lines one window may ask for, and the longest line kept (characters).
MAX_LINES = 20000
MAX_LINE = 4000
_SINCE = re.compile(r"^[0-9A-Za-z :.+-]{1,40}$")

#: Host data of the read-only deploys (set by gpuserve render and gpuserve logs).
OPERATE_DEFAULTS = {
    # the controller path gpuserve render / gpuserve logs have their read-only run write
    # its document to (0600); set by those commands, never in an inventory
    # accepts: str (a path on the controller) or None
    "operate_snapshot": None,
    # the journal window gpuserve logs asks for: journalctl --since (e.g. "-1h",
    # "2026-12-05 01:00"); None: the last journal_lines lines
    # accepts: str or None
    "journal_since": None,
    # the most journal lines gpuserve logs shows (1 to 20000)
    # accepts: int
    "journal_lines": 200,
}


class ServiceJournal(FactBase):
    """A unit's journal lines, ``short-iso-precise`` (text): the last ``lines``, from
    ``since`` when given (journalctl's own time syntax)."""

    def command(self, unit: str, lines: int, since: str | None = None) -> str:
        window = f"--since {shlex.quote(since)} " if since else ""
        return (f"journalctl -u {shlex.quote(unit)} -o short-iso-precise --no-pager "
                f"{window}-n {int(lines)} 2>/dev/null || true")

    def process(self, output: list[str]) -> str:
        return "\n".join(line[:MAX_LINE] for line in output)


def snapshot_target() -> Path:
    target = host.data.get("operate_snapshot")
    if not isinstance(target, str) or not target:
        raise InputError(inventory_source(), "operate_snapshot", "required: the controller "
                         "path to write to (set by gpuserve render / gpuserve logs)")
    if len(state.activated_hosts) > 1:  # one file, one host
        raise InputError(inventory_source(), "operate_snapshot", f"one host at a time, this "
                         f"run has {len(state.activated_hosts)}: give --limit HOST")
    return Path(target)


def write_snapshot(target: Path, doc: dict) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    os.replace(tmp, target)


@packaged_deploy
def serve_launch() -> None:
    """Write the launch the serve deploy would run on this host (see module doc)."""
    target = snapshot_target()
    plan = plan_and_read()
    nccl = fact(FileContents, path=NCCL_ENV_PATH)
    view = launch_view(plan.service, host=host.name, sglang_version=plan.version,
                       lock=plan.lock.name, nccl_env_text="\n".join(nccl) if nccl else None)
    running = read_running()
    write_snapshot(target, {**view.to_dict(), "taken": utc_now(),
                    "running": running.to_dict() if running else None})


def _window(source: str) -> tuple[str | None, int]:
    since = host.data.get("journal_since") or None
    if since is not None and (not isinstance(since, str) or not _SINCE.match(since)):
        raise InputError(source, "journal_since", f"{since!r:.60} is not a journalctl time "
                         "(e.g. -1h, today, \"2026-12-05 01:00\")")
    lines = host.data.get("journal_lines", OPERATE_DEFAULTS["journal_lines"])
    if isinstance(lines, bool) or not isinstance(lines, int) or not 1 <= lines <= MAX_LINES:
        raise InputError(source, "journal_lines", f"must be a whole number in 1..{MAX_LINES}, "
                         f"got {lines!r:.40}")
    return since, lines


@packaged_deploy
def service_journal() -> None:
    """Write the serve unit's journal: the window and the last start (see module doc)."""
    target = snapshot_target()
    since, lines = _window(inventory_source())
    secrets = host_secret_values(host.data.dict())
    window = host.get_fact(ServiceJournal, unit=UNIT_NAME, lines=lines, since=since)
    recent = host.get_fact(ServiceJournal, unit=UNIT_NAME, lines=START_LINES)
    running = read_running()
    write_snapshot(target, {"schema": JOURNAL_SCHEMA, "host": host.name, "taken": utc_now(),
                    "unit": UNIT_NAME, "since": since, "lines": lines,
                    "window": redact(window or "", secrets),
                    "recent": redact(recent or "", secrets),
                    "profile": host.data.get("profile"),
                    "running": running.to_dict() if running else None})
