"""Refit the throughput predictor's fitted constants, and score them out of sample.

    .venv/bin/python bench/throughput_accuracy.py bench/data/throughput.jsonl --holdout source

The constants gpuserve/data/throughput/defaults.yaml marks "(fitted)" (compute
efficiency, per-step and per-layer fixed costs, speculation's exposed CPU time, the
no-P2P small-message bandwidth) were chosen on bench/data/throughput.jsonl itself, so the
accuracy bench's figures on that file are in-sample. Here a coordinate search over a
coarse grid (each constant in turn, each grid value tried, the best kept; two sweeps,
starting from the shipped values) refits them on every source document but one, and
plans that one's rows with the refitted values: leave-one-source-out. Why a grid and not
an optimiser: the score is a median (flat in places, no gradient), and no scipy.

The score a fit minimises: median abs error calibrated by the pair's baseline, plus the
median uncalibrated, plus the share of pairs in the wrong order (the three figures the
accuracy bench prints). A constant no training row moves (all its grid values score the
same) keeps its shipped value and is named: its held-out figure is not out of sample.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import replace
from urllib.parse import urlparse

import gpuserve.throughput.model as model
from gpuserve.throughput.hardware import defaults, link
from gpuserve.throughput.records import Case

#: (section, key, grid): the constants defaults.yaml marks "(fitted)" (and the no-P2P
#: small-message bandwidth, which only one source's rows move), with the grid the search
#: tries besides the shipped value
FITTED: tuple[tuple[str, str, tuple[float, ...]], ...] = (
    ("efficiency", "compute", (0.2, 0.3, 0.45)),
    ("efficiency", "step_overhead_us", (250, 500, 1000)),
    ("efficiency", "layer_overhead_us", (12, 25, 50)),
    ("efficiency", "moe_layer_overhead_us", (0, 25, 50)),
    ("efficiency", "mla_layer_overhead_us", (0, 15, 30)),
    ("speculation", "cycle_cpu_us", (500, 1000, 2000)),
    ("speculation", "cycle_cpu_per_rank_us", (500, 1000, 2000)),
    ("speculation", "cycle_cpu_per_request_us", (0, 100, 200)),
    ("links.pcie-no-p2p", "small_busbw_gbs", (0.25, 0.43, 0.75, 1.5)),
)


def source_group(row: dict) -> str:
    """The source document of a row: its first URL's host and path (a blob's commit and a
    workflow run's attempt dropped), else its source text up to the first space."""
    text = str(row.get("source") or "")
    m = re.search(r"https?://[^\s,;)]+", text)
    if not m:
        return text.split(" ")[0] or "unsourced"
    url = urlparse(m.group(0))
    path = re.sub(r"/blob/[0-9a-f]{7,40}/", "/blob/", url.path)
    path = re.sub(r"/attempts/\d+$", "", path)
    return url.netloc + path


def _section(name: str) -> dict:
    node = defaults()
    for part in name.split("."):
        node = node[part]
    return node


def current() -> dict[tuple[str, str], float]:
    """The fitted constants' values as defaults.yaml ships them."""
    return {(s, k): float(_section(s)[k]) for s, k, _ in FITTED}


def apply(values: dict[tuple[str, str], float], cases: list[Case]) -> None:
    """Put ``values`` into the predictor's (cached) defaults and rebuild the cases' links,
    which copied their class figures when planned."""
    for (section, key), value in values.items():
        _section(section)[key] = value
    for case in cases:
        case.box = replace(case.box, link=link(case.box.link.name))


def score(cases: dict[str, Case], predicted: dict[str, float],
          only: set[str] | None = None, base_of: dict[str, float] | None = None) -> dict:
    """The accuracy bench's figures over the rows of ``only`` (all predicted rows by
    default): median abs errors uncalibrated and calibrated by the pair's baseline, and
    the pairs' order. A row's baseline prediction is ``base_of[row]`` (held out: the same
    fold's), else the baseline's in ``predicted``; a pair without one is not counted."""
    raw, cal, pairs, right = [], [], 0, 0
    for rid in only if only is not None else predicted:
        case = cases[rid]
        raw.append(abs(predicted[rid] / case.measured - 1))
        base = case.row.get("baseline")
        if not base or base == rid:
            continue
        bpred = (base_of or {}).get(rid, predicted.get(base))
        if bpred is None or base not in cases:
            continue
        cal.append(abs(predicted[rid] * cases[base].measured / bpred / case.measured - 1))
        pairs += 1
        right += (predicted[rid] - bpred) * (case.measured - cases[base].measured) > 0
    raw_m = statistics.median(raw) if raw else 0.0
    cal_m = statistics.median(cal) if cal else 0.0
    return {"raw": raw_m, "cal": cal_m, "pairs": pairs, "right": right,
            "loss": cal_m + raw_m + ((pairs - right) / pairs if pairs else 0.0)}


def predict_all(cases: dict[str, Case], ids) -> dict[str, float]:
    return {rid: cases[rid].predict().output_tps for rid in ids}


def fit(cases: dict[str, Case], train: set[str], sweeps: int = 2
        ) -> tuple[dict[tuple[str, str], float], list[str]]:
    """Coordinate search from the shipped values on the rows of ``train``: the fitted
    values, and the constants no training row moves."""
    ids = train  # a held-out baseline is not seen: its pairs drop out of the fit
    values = current()
    flat = set()

    def loss(vals: dict) -> float:
        apply(vals, list(cases.values()))
        return score(cases, predict_all(cases, ids), train)["loss"]

    best = loss(values)
    for sweep in range(sweeps):
        for section, key, grid in FITTED:
            tried = {}
            for value in sorted({*grid, values[(section, key)]}):
                tried[value] = best if value == values[(section, key)] else loss(
                    {**values, (section, key): value})
            if sweep == 0 and len(set(tried.values())) == 1:
                flat.add(f"{section}.{key}")
            pick = min(tried, key=lambda v: (tried[v], v != values[(section, key)]))
            values[(section, key)], best = pick, tried[pick]
    apply(values, list(cases.values()))
    return values, sorted(flat)


def holdout(cases: dict[str, Case]) -> dict:
    """Leave-one-source-out: each source's rows planned with the constants refitted on the
    others; their errors and pairs scored together, beside the in-sample refit's."""
    shipped = current()
    groups: dict[str, set[str]] = {}
    for rid, case in cases.items():
        groups.setdefault(source_group(case.row), set()).add(rid)
    everything = set(cases)
    insample, _ = fit(cases, everything)
    fitted_in = score(cases, predict_all(cases, everything))
    held: dict[str, float] = {}
    base_of: dict[str, float] = {}
    unmoved: dict[str, list[str]] = {}
    spread: dict[tuple[str, str], set[float]] = {}
    for name, ids in groups.items():
        values, flat = fit(cases, everything - ids)
        for key, value in values.items():
            spread.setdefault(key, set()).add(value)
        bases = {cases[r].row.get("baseline") for r in ids} & everything
        pred = predict_all(cases, ids | bases)
        for rid in ids:
            held[rid] = pred[rid]
            base = cases[rid].row.get("baseline")
            if base in pred:
                base_of[rid] = pred[base]
        moved_here = _moved_by(cases, ids)
        still = [f for f in flat if f in moved_here]
        if still:
            unmoved[name] = still
    apply(shipped, list(cases.values()))
    out = score(cases, held, base_of=base_of)
    return {"groups": len(groups), "insample": fitted_in, "insample_values": insample,
            "held": out, "unmoved": unmoved,
            "spread": {k: sorted(v) for k, v in spread.items()}}


def _moved_by(cases: dict[str, Case], ids: set[str]) -> set[str]:
    """The constants whose grid changes a prediction of ``ids``."""
    shipped = current()
    ref = predict_all(cases, ids)
    moved = set()
    for section, key, grid in FITTED:
        apply({**shipped, (section, key): grid[0] if grid[0] != shipped[(section, key)]
               else grid[-1]}, list(cases.values()))
        if predict_all(cases, ids) != ref:
            moved.add(f"{section}.{key}")
    apply(shipped, list(cases.values()))
    return moved


def _memo(fn):
    """``fn(arch, layout, ...)`` cached by its arguments' identity: a case's architecture
    and layout objects live as long as the fit, and neither depends on a fitted constant."""
    seen: dict = {}

    def wrapped(*args, **kwargs):
        key = tuple(a if isinstance(a, str | int | type(None)) else id(a)
                    for a in (*args, *kwargs.values())) + tuple(kwargs)
        if key not in seen:
            seen[key] = fn(*args, **kwargs)
        return seen[key]
    return wrapped


def speed_up() -> None:
    """Cache the per-case shape and collective counts while fitting (pure functions of
    the case's architecture and layout; the grid search re-plans each case ~40 times)."""
    model.shape = _memo(model.shape)
    model.collectives = _memo(model.collectives)
