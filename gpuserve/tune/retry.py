"""Follow-ups of the one-knob sweep: failures retried where they would fit, and the
neighbours of each objective's best launch.

Why: a value can fail beside the incumbent's memory settings and start beside others
(EAGLE-3 dies capturing decode graphs up to batch 512 and starts at 128). Measured
alone it is a failure; the pairing is never measured unless the tune asks for it. A
capture OOM is relieved by a smaller decode graph max bs; a KV pool without room by a
larger mem_fraction_static; an out-of-memory without a known phase by either. The
retry is judged like any candidate before it loads (the planner must say it fits).

A knob can also matter only beside another value (decode graph sizes for a batch under
EP8, not under TP), and a value can pay off only beside another while it loses alone:
with the follow-up loads left, the untried neighbours (one knob changed) of each
objective's best launch, and of the launches within the noise of it, are measured in
rounds, the values that did best alone first, chosen anew after each round.

How: docs/tune.md, "Combinations, retries and neighbours"
"""

from __future__ import annotations

import re
from typing import Any

from gpuserve.tune.candidates import Candidate, candidate_name
from gpuserve.tune.noise import Noise, Where
from gpuserve.tune.outcome import LoadStatus, Outcome, OutcomeStatus, best, score, score_level
from gpuserve.tune.space import MAX_RETRIES, Knob, KnobValue, TuneSpec

GRAPH = "memory.cuda_graph_max_bs"
FRACTION = "memory.mem_fraction_static"
_MEMORY = re.compile(r"out of memory|OutOfMemory|not enough memory|no GPU memory|"
                     r"KV cache|\boom\b", re.I)
_CAPTURE = re.compile(r"captur|cuda graph", re.I)
_KV = re.compile(r"not enough memory|no GPU memory|KV cache|mem[-_]fraction", re.I)


def memory_cause(outcome: Outcome) -> tuple[str, ...]:
    """Which fields relieve ``outcome``'s failure: () when it did not fail for memory."""
    diagnosis = outcome.diagnosis or {}
    text = " ".join(str(x) for x in (outcome.reason, diagnosis.get("outcome"),
                                     diagnosis.get("error")) if x)
    if outcome.status != OutcomeStatus.FAILED or not _MEMORY.search(text):
        return ()
    if _CAPTURE.search(text):
        return (GRAPH,)
    if _KV.search(text):
        return (FRACTION,)
    return (GRAPH, FRACTION)


def _relieves(value: KnobValue, field: str, incumbent, knob: Knob) -> bool:
    """Whether ``value`` sets only memory fields and moves ``field`` the relieving way
    from the incumbent's (smaller graphs, a larger fraction)."""
    if value.extra_args or not value.fields or \
            not all(k.startswith("memory.") for k in value.fields):
        return False
    mine = value.fields.get(field)
    if not isinstance(mine, int | float) or isinstance(mine, bool):
        return False
    section, _, key = field.partition(".")
    theirs = getattr(getattr(incumbent, section), key, None)
    if theirs is None:  # SGLang's automatic value: relative to the knob's other values
        known = [v.fields.get(field) for v in knob.values
                 if isinstance(v.fields.get(field), int | float)]
        theirs = max(known) if field == GRAPH else min(known)
    return mine < theirs if field == GRAPH else mine > theirs


def retries(spec: TuneSpec, knobs: tuple[Knob, ...], outcomes: list[Outcome], ctx: Any,
            objective: str, noise: Noise | None = None) -> list[Candidate]:
    """Candidates pairing each value that failed alone for memory (at most
    ``MAX_RETRIES``) with the best measured value of each knob that relieves its cause."""
    out: list[Candidate] = []
    seen = {o.candidate for o in outcomes}
    for failed in outcomes:  # in the order they were measured: best predicted first
        causes = memory_cause(failed) if failed.phase == "one knob" else ()
        if not causes or len(out) >= MAX_RETRIES:
            continue
        (knob_name, label), = failed.choice.items()
        knob = next(k for k in knobs if k.name == knob_name)
        choice = {knob_name: next(v for v in knob.values if v.label == label)}
        for field in causes:
            relief = _best_relief(knobs, outcomes, ctx.incumbent, field, knob_name, spec,
                                  objective, noise)
            if relief is not None:
                choice.setdefault(relief[0], relief[1])
        if len(choice) < 2:
            continue
        name = candidate_name(spec, choice, ctx.config_key)
        if name not in seen:
            seen.add(name)
            out.append(Candidate(name, "retry", choice))
    return out


def _best_relief(knobs: tuple[Knob, ...], outcomes: list[Outcome], incumbent, field: str,
                 skip: str, spec: TuneSpec, objective: str, noise: Noise | None = None
                 ) -> tuple[str, KnobValue] | None:
    """The relieving value that measured best alone (else the first that relieves); of
    values within the noise of that one alone, the one that relieves most (the smallest
    graphs, the largest fraction): their speed alone does not tell them apart, and the
    retry is for the failure."""
    found: list[tuple[float, int, str, KnobValue, Outcome | None]] = []
    for knob in knobs:
        if knob.name == skip:
            continue
        for index, value in enumerate(knob.values):
            if not _relieves(value, field, incumbent, knob):
                continue
            measured = next((o for o in outcomes if o.phase == "one knob"
                             and o.choice == {knob.name: value.label}), None)
            if measured is not None and measured.status == LoadStatus.FAILED:
                continue
            s = score(measured, objective, spec) if measured else None
            found.append((s if s is not None else float("-inf"), -index, knob.name, value,
                          measured))
    if not found:
        return None
    top = max(found, key=lambda t: (t[0], t[1]))
    if noise is not None and top[4] is not None:
        measured = [t for t in found if t[4] is not None]
        tied = [t for t in measured
                if within_noise(t[4], top[4], objective, spec, noise, len(measured))]
        sign = -1 if field == GRAPH else 1
        top = max(tied, key=lambda t: sign * t[3].fields[field])
    return top[2], top[3]


def within_noise(a: Outcome, b: Outcome, objective: str, spec: TuneSpec,
                 noise: Noise | None, family: int = 1) -> bool:
    """Whether ``a`` and ``b`` are within the noise of each other for ``objective``
    (within 1 % when the noise was not measured); ``family``: the number of a knob's
    values judged at once (:meth:`Noise.separated`: of several values with no effect
    alone, one drawn low by the noise is then not taken for worse)."""
    mine, level = score_level(a, objective, spec)
    ref, at = score_level(b, objective, spec)
    if mine is None or ref is None:
        return False
    if noise is None:
        return abs(mine - ref) <= 0.01 * ref
    return not noise.separated(mine, a.count(level), ref, b.count(at),
                               (Where(a.candidate, level), Where(b.candidate, at)), family)


def neighbours(spec: TuneSpec, knobs: tuple[Knob, ...], outcomes: list[Outcome],
               config_key: str, objective: str, seen: set[str],
               noise: Noise | None = None) -> list[tuple[float, Candidate]]:
    """The launches one knob away from ``objective``'s best, or from a launch within the
    noise of it (which of those is best is the noise's choice), not measured yet, each
    with its promise: the changed value's score alone over the incumbent's. A value can
    pay off only beside another while it loses alone (EAGLE-3's chains below the
    incumbent at its decode graph size and above it at a smaller one), and a knob with no
    effect alone can matter beside another value (graph sizes under EP8). A value that
    failed alone or was never measured alone is not tried here (a memory failure is the
    retries')."""
    top = best(outcomes, objective, spec)
    first = next((o for o in outcomes if o.phase == "incumbent"), None)
    ref = score(first, objective, spec) if first is not None else None
    if top is None or not ref:
        return []
    bases = [top] + [o for o in outcomes if o is not top and o.phase != "incumbent"
                     and o.status == OutcomeStatus.MEASURED
                     and within_noise(o, top, objective, spec, noise)]
    alone = {next(iter(o.choice.items())): s for o in outcomes
             if o.phase == "one knob" and len(o.choice) == 1
             and (s := score(o, objective, spec)) is not None}
    ranked: dict[str, tuple[float, int, Candidate]] = {}
    for rank, base in enumerate(bases):
        chosen = _values_of(base, knobs)
        for knob in knobs:
            current = chosen.get(knob.name)
            for value in knob.values:
                mine = alone.get((knob.name, value.label))
                if mine is None or value is current:
                    continue
                choice = {**chosen, knob.name: value}
                name = candidate_name(spec, choice, config_key)
                if name not in seen and name not in ranked:
                    ranked[name] = (mine / ref, rank, Candidate(name, "neighbour", choice))
    return [(promise, c) for promise, _, c in sorted(ranked.values(),
                                                      key=lambda t: (-t[0], t[1]))]


def _values_of(outcome: Outcome, knobs: tuple[Knob, ...]) -> dict[str, KnobValue]:
    """The knob values an outcome's launch sets, by knob name."""
    by_name = {k.name: k for k in knobs}
    return {k: next(v for v in by_name[k].values if v.label == label)
            for k, label in outcome.choice.items() if k in by_name}
