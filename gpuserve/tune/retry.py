"""One more try for a value that failed alone for memory, with what relieves its cause.

Why: a value can fail beside the incumbent's memory settings and start beside others
(EAGLE-3 dies capturing decode graphs up to batch 512 and starts at 128). Measured
alone it is a failure; the pairing is never measured unless the tune asks for it. A
capture OOM is relieved by a smaller decode graph max bs; a KV pool without room by a
larger mem_fraction_static; an out-of-memory without a known phase by either. The
retry is judged like any candidate before it loads (the planner must say it fits).

How: docs/tune.md, "Failures retried where they would fit"
"""

from __future__ import annotations

import re
from typing import Any

from gpuserve.tune.candidates import Candidate, candidate_name
from gpuserve.tune.outcome import Outcome, score
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
    if outcome.status != "failed" or not _MEMORY.search(text):
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
            objective: str) -> list[Candidate]:
    """Candidates pairing each value that failed alone for memory (at most
    ``MAX_RETRIES``) with the best measured value of each knob that relieves its cause."""
    out: list[Candidate] = []
    seen = {o.candidate for o in outcomes}
    for failed in outcomes:
        causes = memory_cause(failed) if failed.phase == "one knob" else ()
        if not causes or len(out) >= MAX_RETRIES:
            continue
        (knob_name, label), = failed.choice.items()
        knob = next(k for k in knobs if k.name == knob_name)
        choice = {knob_name: next(v for v in knob.values if v.label == label)}
        for field in causes:
            relief = _best_relief(knobs, outcomes, ctx.incumbent, field, knob_name, spec,
                                  objective)
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
                 skip: str, spec: TuneSpec, objective: str) -> tuple[str, KnobValue] | None:
    """The relieving value that measured best alone (else the first that relieves)."""
    found: list[tuple[float, int, str, KnobValue]] = []
    for knob in knobs:
        if knob.name == skip:
            continue
        for index, value in enumerate(knob.values):
            if not _relieves(value, field, incumbent, knob):
                continue
            measured = next((o for o in outcomes if o.phase == "one knob"
                             and o.choice == {knob.name: value.label}), None)
            if measured is not None and measured.status == "failed":
                continue
            s = score(measured, objective, spec) if measured else None
            found.append((s if s is not None else float("-inf"), -index, knob.name, value))
    if not found:
        return None
    _, _, name, value = max(found, key=lambda t: (t[0], t[1]))
    return name, value
