"""``gpuserve compare FILE_OR_DIR...``: where each profile stands, after a switch.

Reads gpuserve result records, SGLang benchmark JSON Lines and the host deploy's
``gpuserve.measure/1`` records; prints per host and scenario the latest run of each
profile against a baseline profile (``--history``: every run and what changed), then the
measured GPU gates; ``--json`` gives the same as one document. Why: after a switch the
question is whether the new profile helped on this host, under the same load.

How: docs/benchmarks.md, "gpuserve.commands.compare: inputs, views, columns and JSON"
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gpuserve import safeload
from gpuserve.errors import InputError
from gpuserve.measure import compare as cmp
from gpuserve.measure.results import ResultRecord, read_results
from gpuserve.measure.start_view import read_start_records, starts_json, starts_table
from gpuserve.quality.view import SKIP_NOTE as QUALITY_SKIP
from gpuserve.quality.view import format_quality, latest_quality
from gpuserve.table import table as fixed_width
from gpuserve.terminal import printable


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "compare",
        help="compare recorded benchmark/smoke results: latest per profile, history, plot",
        description="Read gpuserve result records and SGLang benchmark JSONL; show the "
        "latest run per host, profile and scenario against a baseline profile, or every "
        "run over time (--history).",
    )
    parser.add_argument("paths", nargs="+", metavar="FILE_OR_DIR",
                        help="result files or directories (searched for *.json, *.jsonl)")
    parser.add_argument("--baseline", metavar="PROFILE",
                        help="profile to compare against (default: the oldest record's)")
    parser.add_argument("--history", action="store_true",
                        help="every run, oldest first, with the change from the run before")
    parser.add_argument("--profile", metavar="P", help="only this profile")
    parser.add_argument("--host", metavar="H", help="only this host")
    parser.add_argument("--scenario", metavar="S", help="only this scenario (smoke: smoke)")
    parser.add_argument("--smoke", action="store_true",
                        help="also show smoke checks (hidden when there are bench runs)")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="also draw throughput vs concurrency and ITL vs throughput")
    parser.add_argument("--tune", metavar="NAME",
                        help="only the candidates of tune NAME, side by side, against its "
                        "incumbent (gpuserve tune; docs/tune.md)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.plot:
        from gpuserve.measure.plot import plot_target, require_matplotlib
        require_matplotlib()  # before any output: no half-done run
        plot_target(args.plot)
    skipped: list[str] = []
    measures: list[dict] = []
    records = [r for path in args.paths for r in read_results(path, skipped, measures)]
    # a host's start records live beside its results (gpuserve/measure/starts.py): not news
    skipped = [s for s in skipped if "'gpuserve.start/1'" not in s]
    starts = read_start_records(args.paths, args.host)
    if not records and not measures and not starts:
        raise InputError(", ".join(args.paths), None, "no result records found"
                         + (f" ({len(skipped)} non-result files skipped)" if skipped else ""))
    if not records and args.plot:
        raise InputError(", ".join(args.paths), None, "no result records to plot "
                         f"(only {len(measures)} gpuserve.measure/1 records)")
    _check_host(args.host, records, measures)
    legend: list[str] = []
    if getattr(args, "tune", None):
        records, legend, incumbent = tune_view(args.paths, args.tune, records)
        args.baseline = args.baseline or incumbent
        skipped = [s for s in skipped if "gpuserve.tune-candidate/1" not in s]
    gate_rows = cmp.gate_view(measures, history=args.history, host=args.host)
    doc: dict = {"view": "history" if args.history else "latest"}
    text = ""
    if records and (args.host is None or any(r.host == args.host for r in records)):
        baseline = args.baseline or cmp.default_baseline(records)
        cmp.check_baseline(records, baseline)
        shown = cmp.select(records, profile=args.profile, host=args.host,
                           scenario=args.scenario)
        if args.history:
            rows = cmp.history_view(shown, smoke=args.smoke)
            doc = cmp.history_json(rows)
            text = format_history(rows)
        else:
            rows = cmp.latest_view(shown, baseline, smoke=args.smoke, pool=records)
            doc = cmp.latest_json(rows, baseline)
            text = format_latest(rows, baseline, hidden_smoke=_hidden_smoke(shown, rows))
    if measures:
        doc["gates"] = [cmp.gate_dict(row) for row in gate_rows]
        text = "\n\n".join(t for t in (text, format_gates(gate_rows, args.history)) if t)
    quality = latest_quality(args.paths, host=args.host, profile=args.profile)
    skipped = [s for s in skipped if QUALITY_SKIP not in s]  # shown below, not skipped
    if quality:  # the output-quality checks beside the throughput (docs/quality.md)
        doc["quality"] = quality
        text = "\n\n".join(t for t in (text, format_quality(quality)) if t)
    if starts:  # where each recorded start's time went (gpuserve/measure/start_view.py)
        doc["starts"] = starts_json(starts)
        text = "\n\n".join(t for t in (text, starts_table(starts)) if t)
    if args.json:
        print(json.dumps({**doc, "skipped": skipped}, indent=2, allow_nan=False))
    else:
        lines = [*text.split("\n"), *legend, *(f"skipped {printable(s)}" for s in skipped)]
        print("\n".join(printable(line) for line in lines))
    if args.plot:
        from gpuserve.measure.plot import write_plot
        latest = cmp.latest_view(shown, baseline, pool=records)
        path = write_plot(latest, args.plot, title=f"baseline: {baseline}")
        print(f"plot: wrote {path}", file=sys.stderr)
    return 0


def tune_view(paths: list[str], tune: str, records: list[ResultRecord]
              ) -> tuple[list[ResultRecord], list[str], str | None]:
    """The records of tune ``tune``'s candidates (profile ``<tune>-<12 hex>``), a legend
    of what each candidate set (from the tune's own records, ``tune-<name>/``), and
    its incumbent's name (the baseline)."""
    import re

    from gpuserve.tune.outcome import from_dict

    name = re.compile(rf"^{re.escape(tune)}-[0-9a-f]{{12}}$")
    mine = [r for r in records if r.profile and name.match(r.profile)]
    if not mine:
        raise InputError(", ".join(paths), "--tune", f"no records of tune {tune!r} "
                         "(candidate profiles are named <tune>-<12 hex>)")
    legend, incumbent = [], None
    for path in paths:
        for doc_path in sorted(Path(path).rglob(f"tune-{tune}/*.json")):
            try:  # bounded; a FIFO or a device is skipped, never opened for reading
                outcome = from_dict(safeload.load_json_file(doc_path))
            except (InputError, ValueError):
                continue
            if outcome is None:
                continue
            if outcome.phase == "incumbent":
                incumbent = outcome.candidate
            legend.append(f"{outcome.candidate}: {outcome.label} ({outcome.status}"
                          + (f": {outcome.reason}" if outcome.reason else "") + ")")
    return mine, (["", f"tune {tune}:", *legend] if legend else []), incumbent


def _check_host(host: str | None, records: list[ResultRecord], measures: list[dict]) -> None:
    """--host must name a host of a result or a measure record (a typo is no empty view)."""
    known = {str(r.host) for r in records} | {str(d["host"]) for d in measures}
    if host is not None and host not in known:
        raise InputError(None, "--host", f"no record with host {host!r} (known: "
                         f"{', '.join(sorted(known))})")


def _hidden_smoke(records: list[ResultRecord], rows: list[cmp.LatestRow]) -> int:
    """Smoke groups the latest view left out (said in the footer, never silently)."""
    shown = sum(1 for row in rows if row.group.kind == "smoke")
    return sum(1 for g in cmp.group_runs(records) if g.kind == "smoke") - shown


# ----------------------------------------------------------------------------- text


def fmt(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}f}"


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}%"


def in_out(r: ResultRecord) -> str:
    i, o = cmp.lengths(r)
    return "-" if i is None and o is None else f"{fmt(i)}/{fmt(o)}"


def gate_cell(r: ResultRecord) -> str:
    return {"pass": "pass", "fail": "FAIL"}.get(cmp.gate_text(r) or "", "-")


def table(headers: tuple[str, ...], cells: list[tuple[str, ...]], right: set[str]) -> list[str]:
    """The records' table (gpuserve.table), cells escaped, the ``right`` headers'
    columns right-aligned."""
    rows = [headers, *[tuple(printable(c) for c in row) for row in cells]]
    return fixed_width(rows, right={i for i, h in enumerate(headers) if h in right})


class Notes:
    """Footnotes for records that carry a note (composed figures stay labelled)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def profile(self, r: ResultRecord) -> str:
        if not r.note:
            return r.profile or "-"
        self.lines.append(f"[{len(self.lines) + 1}] {printable(str(r.source))}: "
                          f"{printable(str(r.note))}")
        return f"{r.profile or '-'} [{len(self.lines)}]"


LATEST = ("host", "profile", "scenario", "conc", "in/out", "out tok/s", "runs (min-max)",
          "TTFT ms", "ITL ms", "p99 TTFT", "sglang", "tok/s%", "TTFT%", "ITL%", "gate")
RIGHT = {"conc", "out tok/s", "TTFT ms", "ITL ms", "p99 TTFT", "tok/s%", "TTFT%", "ITL%"}


def _runs(group: cmp.Group) -> str:
    span = group.tok_s_range
    if len(group.runs) == 1 or span is None:
        return str(len(group.runs))
    return f"{len(group.runs)} ({fmt(span[0])}-{fmt(span[1])})"


def _versus(row: cmp.LatestRow) -> tuple[str, str, str]:
    if row.is_baseline:
        return ("baseline", "", "")
    if row.change is None:
        return ("n/a", "", "")
    return tuple(pct(row.change.pct[k]) for k in cmp.CHANGE_FIGURES)


def format_latest(rows: list[cmp.LatestRow], baseline: str, hidden_smoke: int = 0) -> str:
    notes = Notes()
    cells = []
    for row in rows:
        r = row.group.latest
        cells.append((r.host or "-", notes.profile(r), row.group.scenario, fmt(r.concurrency),
                      in_out(r), fmt(r.output_tok_s), _runs(row.group),
                      fmt(r.figures.get("median_ttft_ms")), fmt(r.figures.get("median_itl_ms")),
                      fmt(r.figures.get("p99_ttft_ms")), r.sglang_version or "-",
                      *_versus(row), gate_cell(r)))
    lines = table(LATEST, cells, RIGHT)
    lines += ["", f"baseline: {printable(baseline)} (default: the oldest record's profile; "
              "--baseline to choose)",
              "tok/s%, TTFT%, ITL%: the latest run against the baseline's latest good run "
              "(gate not failed) of the same workload on the same host; n/a: there is none"]
    if hidden_smoke:
        lines.append(f"{hidden_smoke} smoke group(s) not shown: --smoke shows them.")
    return "\n".join(lines + notes.lines)


HISTORY = ("when", "host", "profile", "scenario", "conc", "in/out", "out tok/s", "TTFT ms",
           "ITL ms", "sglang", "gate", "vs prev", "changed")


def format_history(rows: list[cmp.HistoryRow]) -> str:
    notes = Notes()
    cells = []
    for row in rows:
        r = row.record
        vs = "-" if row.change is None else pct(row.change.pct["output_tok_s"])
        cells.append((r.timestamp or "-", r.host or "-", notes.profile(r), row.group.scenario,
                      fmt(r.concurrency), in_out(r), fmt(r.output_tok_s),
                      fmt(r.figures.get("median_ttft_ms")), fmt(r.figures.get("median_itl_ms")),
                      r.sglang_version or "-", gate_cell(r), vs, ", ".join(row.changed) or "-"))
    lines = table(HISTORY, cells, RIGHT | {"vs prev"})
    lines += ["", "vs prev: output tok/s against the run before (same host, profile, "
              "scenario and workload)",
              "changed: what differs from that run's setup (sglang version, lock, profile "
              "file, launch)"]
    return "\n".join(lines + notes.lines)


GATES = ("host", "when", "class", "P2P", "AR busbw", "vs", "lat us", "P2P on/off", "AG busbw",
         "A2A busbw", "NCCL", "runs", "gate")
GATES_RIGHT = {"AR busbw", "lat us", "P2P on/off", "AG busbw", "A2A busbw", "runs"}


def _p2p_cell(row: cmp.GateRow) -> str:
    if row.p2p is None:
        return "-"
    if row.p2p:
        return "on"
    return {"hung": "off (hung)", "slower": "off (slower)",
            "not_measured": "off (not measured)"}.get(row.p2p_result or "", "off")


def _size(size: int | None) -> str:
    if size is None:
        return ""
    gib = size / 2**30
    return f" @{gib:g}G" if gib >= 1 and gib == int(gib) else f" @{size}"


def _versus_cell(row: cmp.GateRow) -> str:
    status = {"pass": "pass", "fail": "FAIL", "baseline": "new baseline",
              "missing": "MISSING", "skip": "skip"}.get(row.busbw_status or "", "-")
    if row.busbw_reference is None:
        return status
    kind = "base" if row.busbw_reference_kind == "baseline" else "exp"
    return f"{status} ({kind} {fmt(row.busbw_reference, 2)})"


def _on_off(row: cmp.GateRow) -> str:
    def one(value: float | None, hung: bool) -> str:
        return "hung" if hung else fmt(value, 2)

    if row.p2p_on_gbs is None and not row.p2p_on_hung:
        return f"-/{one(row.p2p_off_gbs, row.p2p_off_hung)}"
    return f"{one(row.p2p_on_gbs, row.p2p_on_hung)}/{one(row.p2p_off_gbs, row.p2p_off_hung)}"


def format_gates(rows: list[cmp.GateRow], history: bool = False) -> str:
    """The measured GPU gates table (gpuserve.measure/1 records), control characters
    escaped like every cell of compare's tables."""
    cells = []
    for row in rows:
        cells.append((row.host, row.timestamp, row.topology or "-", _p2p_cell(row),
                      fmt(row.busbw_gbs, 2) + _size(row.size_bytes), _versus_cell(row),
                      fmt(row.latency_us), _on_off(row), fmt(row.all_gather_gbs, 2),
                      fmt(row.alltoall_gbs, 2), row.nccl_version or "-", str(row.runs),
                      "pass" if row.passed else "FAIL"))
    title = ("measured GPU gates, every measurement (gpuserve.measure/1 records)" if history
             else "measured GPU gates, latest per host (gpuserve.measure/1 records)")
    lines = [title, *table(GATES, cells, GATES_RIGHT)]
    lines += ["", "AR busbw: all-reduce GB/s at the gate size on the chosen path (P2P on or "
              "off); vs: its verdict against the expectation (exp) or the host's baseline "
              "(base); lat us: the slowest 8 B-1 KiB all-reduce",
              "P2P on/off: all-reduce busbw with P2P on / NCCL_P2P_DISABLE=1 (- not run, "
              "hung: killed at the timeout); AG/A2A busbw: all-gather / all-to-all on the "
              "chosen path (EP hosts)"]
    failing = [r for r in rows if r.failed]
    for r in failing:
        lines.append(printable(f"{r.host} {r.timestamp}: {', '.join(r.failed)}"))
    return "\n".join(lines)
