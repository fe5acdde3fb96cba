#!/usr/bin/env python3
"""Wrap a real raw SGLang log the way journald or ``docker logs -t`` hands it to a user.

    .venv/bin/python tools/wrap_log.py RAW.log MODE > OUT.log
    .venv/bin/python tools/wrap_log.py --fixtures   # (re)writes tests/fixtures/logs/wrapped/

Why: users paste ``journalctl -u gpuserve-sglang.service`` or ``docker logs -t`` output into
``gpuserve plan --log``; the parser must read it exactly like the raw log. The output is
COMPOSED (its header says so, from which raw fixture and in which documented format), never
a capture. Each line's time is the SGLang line's own timestamp (``[YYYY-MM-DD HH:MM:SS ...]``),
the sub-second part is the line number, the host is ``gpu01`` and the identifier ``sglang``
(gpuserve's unit's SyslogIdentifier default, gpuserve/serve/render.py).

Modes and their documented formats:
  journal-short, journal-short-precise, journal-short-iso, journal-short-iso-precise:
    journalctl(1) --output (https://www.freedesktop.org/software/systemd/man/latest/
    journalctl.html): "Oct 16 09:06:09 host ident[pid]: ", the same with microseconds,
    "2025-10-16T09:06:09+00:00 host ident[pid]: " and with microseconds;
  docker: docker logs --timestamps (https://docs.docker.com/reference/cli/docker/container/
    logs/): an RFC3339Nano timestamp ("2025-10-16T09:06:09.000000003Z") and one space.
"""

from __future__ import annotations

import re
import sys
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "tests" / "fixtures" / "logs" / "wrapped"
MODES = (
    "journal-short", "journal-short-precise", "journal-short-iso",
    "journal-short-iso-precise", "docker",
)
# (raw fixture, modes) the committed wrapped fixtures come from
FIXTURES = {
    "sglang_logs/startup_pr11716_tp8.log": MODES,
    "logs/sglang_pr12978_graph_end_two_ranks.log": ("journal-short", "docker"),
}
_TS = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
_DOCS = {
    "journal": "journalctl(1) --output "
    "https://www.freedesktop.org/software/systemd/man/latest/journalctl.html",
    "docker": "docker logs --timestamps "
    "https://docs.docker.com/reference/cli/docker/container/logs/",
}


def prefix(mode: str, when: datetime, n: int) -> str:
    """The collector's prefix for the ``n``-th line logged at ``when``."""
    ident = "gpu01 sglang[4242]: "
    if mode == "journal-short":
        return f"{when:%b %d %H:%M:%S} {ident}"
    if mode == "journal-short-precise":
        return f"{when:%b %d %H:%M:%S}.{n:06d} {ident}"
    if mode == "journal-short-iso":
        return f"{when:%Y-%m-%dT%H:%M:%S}+00:00 {ident}"
    if mode == "journal-short-iso-precise":
        return f"{when:%Y-%m-%dT%H:%M:%S}.{n:06d}+00:00 {ident}"
    if mode == "docker":
        return f"{when:%Y-%m-%dT%H:%M:%S}.{n:09d}Z "
    raise SystemExit(f"wrap_log.py: unknown mode {mode!r}; known: {', '.join(MODES)}")


def wrap(raw: str, mode: str, source: str) -> str:
    """``raw`` with every SGLang line wrapped; its comment lines become the header."""
    doc = _DOCS["docker" if mode == "docker" else "journal"]
    out = [
        f"# COMPOSED by tools/wrap_log.py from {source} (a real raw log), wrapped as {mode}: "
        f"{doc}",
    ]
    when = None
    for n, line in enumerate(raw.splitlines(), 1):
        if line.startswith("#"):
            out.append("# raw log's " + line[2:])
            continue
        m = _TS.match(line)
        when = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S") if m else when
        if when is None:
            raise SystemExit(f"wrap_log.py: {source}:{n}: no SGLang timestamp to wrap with")
        out.append(prefix(mode, when, n) + line)
    return "\n".join(out) + "\n"


def write_fixtures() -> None:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for rel, modes in FIXTURES.items():
        raw_path = ROOT / "tests" / "fixtures" / rel
        for mode in modes:
            out = OUT_DIR / f"{raw_path.stem}.{mode}.log"
            out.write_text(wrap(raw_path.read_text(), mode, f"tests/fixtures/{rel}"))
            print(out.relative_to(ROOT))


def main(argv: list[str]) -> None:
    if argv == ["--fixtures"]:
        write_fixtures()
    elif len(argv) == 2:
        sys.stdout.write(wrap(Path(argv[0]).read_text(), argv[1], argv[0]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
