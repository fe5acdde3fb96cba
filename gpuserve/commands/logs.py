"""``gpuserve logs INVENTORY --limit HOST``: the SGLang service's journal on one host,
with the diagnosis of its last start on top (``gpuserve plan --log``'s).

Why: the first question after a deploy is "what did the server say"; the journal holds
it, and SGLang's start-up lines already carry the memory figures ``plan --log`` reads.
Read through a read-only deploy (roles/deploys/operate.py ``service_journal``): bounded
(``--lines``, at most 20000, long lines cut), every secret of the host's data masked
before the text leaves the deploy. ``--follow`` then streams new lines (``pyinfra exec``
of ``journalctl -f``), masked the same way here. How: docs/operate.md.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from gpuserve.errors import InputError

JOURNAL_DEPLOY = "gpuserve.roles.deploys.operate.service_journal"
UNIT = "gpuserve-sglang.service"
SCHEMA = "gpuserve.service-journal/1"
_STARTED = re.compile(r"systemd\[1\]: Started gpuserve-sglang\.service")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "logs",
        help="the SGLang service's journal on one host, its last start diagnosed",
        description="Read the serve unit's journal on one host of a pyinfra inventory "
        "(connects; changes nothing): the diagnosis of the last start (as gpuserve plan "
        "--log), then the journal's last lines or those --since; --follow streams on.",
    )
    p.add_argument("inventory", help="pyinfra inventory (e.g. inventory/gpu.py)")
    p.add_argument("--limit", help="the inventory's host (optional for one host)")
    p.add_argument("--since", help='journalctl time: "-1h", "today", "2026-12-05 01:00"')
    p.add_argument("--lines", type=int, default=200, help="the most lines shown (200)")
    p.add_argument("--follow", "-f", action="store_true", help="then stream new lines")
    p.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                   help="override host data, as pyinfra's --data (repeatable)")
    p.add_argument("--json", action="store_true", help="the journal and diagnosis as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpuserve.commands._readonly import host_data, read_document

    if not 1 <= args.lines <= 20000:
        raise InputError("--lines", None, f"must be in 1..20000, got {args.lines}")
    name, data = host_data(args.inventory, args.limit, args.data)
    window = [f"journal_lines={args.lines}"] + (
        [f"journal_since={args.since}"] if args.since else [])
    doc = read_document(args.inventory, name, JOURNAL_DEPLOY, [*args.data, *window])
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise InputError(args.inventory, name, f"the read-only run wrote no {SCHEMA} document")
    recent, shown = str(doc.get("recent") or ""), str(doc.get("window") or "")
    start, diagnosis = last_start(recent)
    timing = start_phases(recent) if start else {}
    if args.json:
        print(json.dumps({"host": name, "unit": UNIT, "last_start": start,
                          "profile": doc.get("profile"), "running": doc.get("running"),
                          "phases": timing,
                          "diagnosis": diagnosis.to_dict() if diagnosis else None,
                          "journal": shown.splitlines()}, indent=2))
        return 0
    from gpuserve.commands.render import running_line

    print(running_line(doc.get("running"), doc.get("profile")).replace("# running:",
                                                                       f"# {name}: running:"))
    print_report(name, start, diagnosis, shown, args, timing)
    if args.follow:
        follow(args, name, data)
    return 0


def last_start(journal: str):
    """(the last start's first line, its startup-log diagnosis or None)."""
    from gpuserve.memory.startup_log import diagnose, parse_log
    from gpuserve.tune.snapshot import last_run

    lines = journal.splitlines()
    starts = [i for i, line in enumerate(lines) if _STARTED.search(line)]
    if not starts:
        return None, None
    text = last_run(journal)
    try:
        return lines[starts[-1]], diagnose(parse_log(text, f"{UNIT} (last start)"))
    except InputError:  # no SGLang start-up line yet (still loading, or died before)
        return lines[starts[-1]], None


def start_phases(journal: str) -> dict[str, float]:
    """Where the last start's time went (gpuserve/measure/start_phases.py)."""
    from gpuserve.measure.start_phases import phases
    from gpuserve.tune.snapshot import last_run

    return phases(last_run(journal))


def print_report(name: str, start: str | None, diagnosis, shown: str,
                 args: argparse.Namespace, timing: dict | None = None) -> None:
    from gpuserve.commands.plan import print_diagnosis
    from gpuserve.measure.start_phases import format_phases

    if start is None:
        print(f"# {name}: {UNIT}: no start in the journal's last lines")
    else:
        stamp = start.split(" ", 1)[0]
        outcome = diagnosis.outcome if diagnosis else "no SGLang start-up lines yet"
        print(f"# {name}: {UNIT}: last start {stamp}: {outcome}")
        if timing:
            print(f"# start-up: {format_phases(timing)}")
        if diagnosis:
            print_diagnosis(diagnosis)
    window = f"since {args.since}, at most {args.lines} lines" if args.since else \
        f"last {args.lines} lines"
    print(f"# journal of {UNIT} ({window})")
    if shown:
        print(shown)
    sys.stdout.flush()


def follow(args: argparse.Namespace, name: str, data: dict) -> None:
    """Stream new journal lines until interrupted, secrets masked."""
    from gpuserve.commands._readonly import stream
    from gpuserve.launch.secrets import host_secret_values
    from gpuserve.redact import redact

    secrets = host_secret_values(data)
    command = ["journalctl", "-u", UNIT, "-o", "short-iso-precise", "--no-pager", "-f",
               "-n", "0"]
    try:
        for line in stream(args.inventory, name, command, args.data):
            print(redact(line, secrets)[:4000], flush=True)
    except KeyboardInterrupt:
        pass
