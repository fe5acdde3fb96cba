"""How far the throughput predictor is from real measurements.

    .venv/bin/python bench/throughput_accuracy.py bench/data/throughput.jsonl [--rows]

FILE holds measurements in the public JSONL schema (gpuserve/throughput/records.py; a
``models.yaml`` beside it maps Hub repo ids to model records). For each row the predictor
plans the launch on the row's box (GPU, NVLink/P2P, nodes) and workload (concurrency,
input and output lengths) without seeing its figure. Uncalibrated: the prediction as is.
Calibrated by the pair's baseline: one multiplicative factor, the baseline row's
measured/predicted, applied to each row that names it (a baseline row itself is not
counted there). A pair is ordered right when prediction and measurement agree on which of
the row and its baseline is faster. ``--rows`` prints every row. The last line is the
summary the docs quote:

    throughput accuracy: N of M measurements planned, median abs error U % uncalibrated,
    C % calibrated by the pair's baseline; pairs K/P ordered right
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuserve import safeload  # noqa: E402
from gpuserve.errors import InputError  # noqa: E402
from gpuserve.throughput.records import Case, case_from_row, read_rows  # noqa: E402


def aliases_beside(path: Path) -> dict:
    """The data set's own repo id -> record map (``models.yaml`` beside FILE), if any."""
    beside = path.parent / "models.yaml"
    if not beside.is_file():
        return {}
    doc = safeload.load_yaml_file(beside)
    return dict(doc.get("models") or {}) if isinstance(doc, dict) else {}


def evaluate(path: Path) -> dict:
    """Every row planned (or why not), its errors, and the pairs' order."""
    rows = read_rows(path, strict=False)
    aliases = aliases_beside(path)
    cases: dict[str, Case] = {}
    skipped: dict[str, str] = {}
    predicted: dict[str, float] = {}
    for row in rows:
        rid = str(row.get("id") or f"line {row['_line']}")
        try:
            case = case_from_row(row, aliases)
            if not isinstance(case, str):
                predicted[rid] = case.predict().output_tps
        except (InputError, ValueError, ArithmeticError, TypeError, KeyError) as e:
            case = f"not planned: {type(e).__name__}: {e}"  # one bad row, not the bench
        if isinstance(case, str):
            skipped[rid] = case
            continue
        cases[rid] = case
    out = {"rows": len(rows), "planned": len(cases), "skipped": skipped, "lines": []}
    raw, cal, pairs, right = [], [], 0, 0
    for rid, case in cases.items():
        err = predicted[rid] / case.measured - 1
        raw.append(abs(err))
        line = {"id": rid, "measured": case.measured, "predicted": predicted[rid],
                "error": err, "calibrated": None, "ordered": None}
        base = case.row.get("baseline")
        if base and base != rid and base in cases:
            factor = cases[base].measured / predicted[base]
            line["calibrated"] = predicted[rid] * factor / case.measured - 1
            cal.append(abs(line["calibrated"]))
            pairs += 1
            ok = (predicted[rid] - predicted[base]) * (case.measured - cases[base].measured) > 0
            right += ok
            line["ordered"] = ok
        out["lines"].append(line)
    out.update(raw=_median(raw), cal=_median(cal), pairs=pairs, right=right, cases=cases)
    return out


def _median(values: list[float]) -> float | None:
    return statistics.median(values) * 100 if values else None


def _pct(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "-"


def print_holdout(cases: dict) -> None:
    """The in-sample refit's figures and the leave-one-source-out ones, before the
    summary line (bench/throughput_fit.py)."""
    import throughput_fit as tf

    tf.speed_up()
    res = tf.holdout(cases)
    values = ", ".join(f"{s.split('.')[-1]}.{k}={v:g}"
                       for (s, k), v in res["insample_values"].items())
    for name, ids in res["unmoved"].items():
        print(f"holdout: without {name}, no other row moves {', '.join(ids)}: "
              "its rows keep the shipped value (not out of sample)")
    ins, held = res["insample"], res["held"]
    folds = ", ".join(f"{k}: {'/'.join(f'{v:g}' for v in vs)}"
                      for (_, k), vs in res["spread"].items() if len(vs) > 1)
    print(f"holdout: values the folds' refits chose (constants not listed: one value): "
          f"{folds or 'none'}")
    print(f"holdout: refit on all rows: {values}")
    print(f"holdout: in-sample (refit on all rows) median abs error {ins['raw']:.1%} "
          f"uncalibrated, {ins['cal']:.1%} calibrated; pairs {ins['right']}/{ins['pairs']}")
    print(f"holdout: leave-one-source-out ({res['groups']} sources) median abs error "
          f"{held['raw']:.1%} uncalibrated, {held['cal']:.1%} calibrated; "
          f"pairs {held['right']}/{held['pairs']} ordered right")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", help="measurements, JSONL in the public schema")
    ap.add_argument("--rows", action="store_true", help="print every row")
    ap.add_argument("--holdout", choices=["source"], help="also refit the fitted constants "
                    "without each source document and score its rows out of sample "
                    "(bench/throughput_fit.py)")
    args = ap.parse_args(argv)
    try:
        out = evaluate(Path(args.file))
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.rows:
        for line in out["lines"]:
            cal = line["calibrated"]
            print(f"{line['id'][:70]:<70} measured {line['measured']:9.1f} predicted "
                  f"{line['predicted']:9.1f} ({line['error']:+.0%})"
                  + (f" calibrated {cal:+.0%}" if cal is not None else "")
                  + ("" if line["ordered"] is None else
                     " order ok" if line["ordered"] else " ORDER WRONG"))
    for rid, why in out["skipped"].items():
        print(f"not planned: {rid}: {why}")
    if args.holdout:
        print_holdout(out["cases"])
    print(f"throughput accuracy: {out['planned']} of {out['rows']} measurements planned, "
          f"median abs error {_pct(out['raw'])} % uncalibrated, {_pct(out['cal'])} % "
          f"calibrated by the pair's baseline; pairs {out['right']}/{out['pairs']} "
          "ordered right")
    return 0


if __name__ == "__main__":
    sys.exit(main())
