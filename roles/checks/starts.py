"""Keep the memory figures of the server start a deploy made: after the health gate
(healthy or not), the unit's journal of that start is read once and SGLang's own lines
become a start record on the controller (gpuserve/measure/starts.py), which the next
plan on this host calibrates from. A run that changed nothing on the host reads nothing.
"""

from __future__ import annotations

import shlex

from pyinfra import host, logger
from pyinfra.api import FactBase

from gpuserve.errors import InputError
from gpuserve.measure.results import utc_now
from gpuserve.measure.start_phases import phases
from gpuserve.measure.starts import StartSpec, from_log, read_starts, write_start
from gpuserve.memory.startup_log import parse_log
from gpuserve.redact import redact
from gpuserve.serve.checks import results_root
from gpuserve.tune.snapshot import error_line, last_run

#: journal lines read for one start (a start prints some hundred per rank)
START_LINES = 4000


class StartJournal(FactBase):
    """The unit's last ``lines`` journal lines, ``short-iso-precise`` (text)."""

    def command(self, unit: str, lines: int) -> str:
        return (f"journalctl -u {shlex.quote(unit)} -o short-iso-precise --no-pager "
                f"-n {int(lines)} 2>/dev/null || true")

    def process(self, output: list[str]) -> str:
        return "\n".join(output)


def record_start(spec: StartSpec | None, unit: str) -> None:
    """At execute time: the start record of the unit's last start, written on the
    controller unless one of that start exists. Never fails the host: a journal without
    SGLang's memory lines, or a record that cannot be written, is a warning."""
    if spec is None:
        return
    text = host.get_fact(StartJournal, unit=unit, lines=START_LINES) or ""
    lines = last_run(text)
    first = lines.split("\n", 1)[0]
    server_start = first.split(" ", 1)[0] if "Started " in first else ""
    if not server_start:
        return
    root = results_root(spec.results_dir)
    if any(r.server_start == server_start for r in read_starts(root, host.name)[:5]):
        return
    try:
        log = parse_log(lines, f"{host.name}: journal of {unit}")
    except InputError:
        return  # no SGLang start-up line: it died before printing any
    error = error_line(lines)
    try:
        record = from_log(log, spec, host=host.name, timestamp=utc_now(),
                          server_start=server_start, phases=phases(lines),
                          error=redact(error, spec.secrets) if error else None)
        path = write_start(root, record)
    except (InputError, OSError) as e:
        logger.warning(f"{host.name}: start: memory figures not recorded: {e}")
        return
    after = record.free_after_weights_gib
    logger.info(f"{host.name}: start: recorded {path} ({record.outcome}"
                + (f", {after:.2f} GiB free after weights" if after is not None else "") + ")")
