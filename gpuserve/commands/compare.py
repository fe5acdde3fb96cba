"""``gpuserve compare FILE_OR_DIR...``: recorded runs side by side, against a baseline.

Reads gpuserve result records (``results/<host>/*.json``, written by the serve deploy's
smoke check) and SGLang benchmark JSON Lines (``python -m sglang.benchmark.serving
--output-file``; the profile is the line's ``--tag``, else the file's stem), groups them
by profile and host, and prints one row per run with output tok/s, median TTFT and ITL,
and the change in output tok/s against the baseline profile (``--baseline``, default the
profile of the first record read). A run is only compared with a baseline run of the
same workload (kind, concurrency, random input/output lengths): a smoke figure is never
set against a 64-way benchmark. ``--json`` prints the same for machines.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from gpuserve.errors import InputError
from gpuserve.measure.results import ResultRecord, read_results


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "compare",
        help="compare recorded smoke/benchmark results side by side",
        description="Read gpuserve result records and SGLang benchmark JSONL, group them "
        "by profile and host, and show output tok/s, TTFT, ITL and the change against a "
        "baseline profile.",
    )
    parser.add_argument("paths", nargs="+", metavar="FILE_OR_DIR",
                        help="result files or directories (searched for *.json, *.jsonl)")
    parser.add_argument("--baseline", metavar="PROFILE",
                        help="profile to compare against (default: the first record's)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)


@dataclass(frozen=True)
class Row:
    record: ResultRecord
    reference: ResultRecord | None  # the baseline run this row is compared with
    change_pct: float | None

    @property
    def is_baseline(self) -> bool:
        return self.reference is self.record


def run(args: argparse.Namespace) -> int:
    records = [r for path in args.paths for r in read_results(path)]
    if not records:
        raise InputError(", ".join(args.paths), None, "no result records found")
    baseline = args.baseline or records[0].profile
    rows = compare(records, baseline)
    if args.json:
        print(json.dumps({"baseline": baseline, "records": [row_dict(r) for r in rows]},
                         indent=2))
    else:
        print(format_table(rows, baseline))
    return 0


def compare(records: list[ResultRecord], baseline: str | None) -> list[Row]:
    """Rows grouped by (profile, host) in order of first appearance, each with its
    baseline run (same workload; same host preferred; the latest) and the change."""
    if baseline not in {r.profile for r in records}:
        known = ", ".join(sorted({str(r.profile) for r in records}))
        raise InputError(None, "--baseline", f"no record of profile {baseline!r} "
                         f"(profiles read: {known})")
    groups: dict[tuple, list[ResultRecord]] = {}
    for r in records:
        groups.setdefault((r.profile, r.host), []).append(r)
    base_runs = [r for r in records if r.profile == baseline]
    rows: list[Row] = []
    for members in groups.values():
        for r in sorted(members, key=lambda m: (str(m.workload), m.timestamp or "")):
            ref = _reference(r, base_runs)
            rows.append(Row(r, ref, _change(r, ref)))
    return rows


def _reference(record: ResultRecord, base_runs: list[ResultRecord]) -> ResultRecord | None:
    same = [b for b in base_runs if b.workload == record.workload]
    if not same:
        return None
    same_host = [b for b in same if b.host == record.host]
    pool = same_host or same
    # the latest run; input order breaks ties (and orders runs without a timestamp)
    return max(enumerate(pool), key=lambda ib: (ib[1].timestamp or "", ib[0]))[1]


def _change(record: ResultRecord, ref: ResultRecord | None) -> float | None:
    if ref is None or ref is record:
        return None
    value, base = record.output_tok_s, ref.output_tok_s
    if value is None or not base:
        return None
    return (value - base) / base * 100.0


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}f}"


def vs_text(row: Row) -> str:
    if row.is_baseline:
        return "baseline"
    if row.reference is None:
        return "- (no baseline run of this workload)"
    if row.change_pct is None:
        return "-"
    return (f"{row.change_pct:+.1f}% vs {row.reference.profile} "
            f"{_fmt(row.reference.output_tok_s)}")


def _lengths(r: ResultRecord) -> str:
    i, o = r.figures.get("random_input_len"), r.figures.get("random_output_len")
    return "-" if i is None and o is None else f"{_fmt(i)}/{_fmt(o)}"


def _short_hash(h: str | None) -> str:
    return h.split(":", 1)[-1][:8] if h else "-"


HEADERS = ("profile", "host", "sglang", "launch", "kind", "conc", "in/out",
           "out tok/s", "TTFT ms", "ITL ms", "vs baseline")
RIGHT = {"conc", "out tok/s", "TTFT ms", "ITL ms"}


def format_table(rows: list[Row], baseline: str) -> str:
    notes: list[str] = []

    def profile_cell(r: ResultRecord) -> str:
        if not r.note:
            return r.profile or "-"
        notes.append(f"[{len(notes) + 1}] {r.source}: {r.note}")
        return f"{r.profile or '-'} [{len(notes)}]"

    cells = [HEADERS] + [(
        profile_cell(r.record), r.record.host or "-", r.record.sglang_version or "-",
        _short_hash(r.record.launch_hash), r.record.kind, _fmt(r.record.concurrency),
        _lengths(r.record), _fmt(r.record.output_tok_s),
        _fmt(r.record.figures.get("median_ttft_ms")),
        _fmt(r.record.figures.get("median_itl_ms")), vs_text(r),
    ) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADERS))]
    lines = []
    for c in cells:
        parts = [c[i].rjust(widths[i]) if HEADERS[i] in RIGHT else c[i].ljust(widths[i])
                 for i in range(len(HEADERS))]
        lines.append("  ".join(parts).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines.append(f"baseline: {baseline}; a run is compared with the latest baseline run of "
                 "the same kind, concurrency and input/output lengths (same host preferred).")
    lines.extend(notes)
    return "\n".join(lines)


def row_dict(row: Row) -> dict:
    r = row.record
    doc = r.to_dict()
    doc.pop("schema")
    doc.update({
        "source": r.source, "concurrency": r.concurrency, "output_tok_s": r.output_tok_s,
        "median_ttft_ms": r.figures.get("median_ttft_ms"),
        "median_itl_ms": r.figures.get("median_itl_ms"),
        "is_baseline": row.is_baseline,
        "vs_baseline": None if row.reference is None or row.is_baseline else {
            "profile": row.reference.profile, "host": row.reference.host,
            "source": row.reference.source, "output_tok_s": row.reference.output_tok_s,
            "change_pct": None if row.change_pct is None else round(row.change_pct, 2),
        },
    })
    return doc
