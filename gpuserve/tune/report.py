"""A tune's result: the table of every candidate, the winners' profile files, the plots.

The winner of an objective is written as a profile that extends the incumbent and sets
the winning values, with its provenance in a comment header (host, SGLang version, lock,
date of the measurement, the records), so ``--data profile=FILE`` serves it as it is.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from gpuserve.errors import GpuserveError
from gpuserve.table import table as fixed_width
from gpuserve.tune.noise import Where
from gpuserve.tune.outcome import Outcome, OutcomeStatus, goodput, pareto_front, score
from gpuserve.tune.search import TuneRun
from gpuserve.tune.snapshot import HostSnapshot
from gpuserve.tune.space import TuneSpec, nested


def _num(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def table(run: TuneRun) -> list[str]:
    """One row per candidate: status, predicted and measured, SLO, why."""
    spec = run.spec
    good = spec.objective("goodput")
    top = max(spec.loads)
    head = ("candidate", "phase", "status", "pred c1", "c1 tok/s (mean +- interval, runs)",
            "ratio", f"c{top} tok/s", "goodput", "why / numbers")
    rows = [head]
    for o in run.outcomes:
        pred = (o.prediction or {}).get("single_tok_s")
        ratio = (o.single / pred) if (pred and o.single) else None
        gp = goodput(o, good.slo)[0] if good and o.levels else None
        slo = "-" if not good or o.status in (OutcomeStatus.PRUNED, OutcomeStatus.FAILED) else (
            f"{gp:,.1f}" if gp is not None else "misses SLO")
        why = o.reason
        if o.status == OutcomeStatus.PRUNED and o.numbers:
            why += " [" + ", ".join(f"{k} {v}" for k, v in o.numbers.items()) + "]"
        if o.status == OutcomeStatus.FAILED and o.diagnosis:
            why += f" [startup log: {o.diagnosis.get('outcome')}]"
        # a launch that failed its quality check is refused whatever its speed
        status = ("refused: quality" if o.status == OutcomeStatus.FAILED
                  and o.reason.startswith("quality:") else str(o.status))
        rows.append((o.label, o.phase, status, _num(pred), _spread(run, o, 1),
                     _num(ratio, 2), _spread(run, o, top), slo, why))
    return fixed_width(rows, rule=False, free_last=True)


def _spread(run: TuneRun, o: Outcome, level: int) -> str:
    """A level's mean, with its interval and runs where it ran more than once."""
    value = o.figure(level)
    runs = len(o.runs(level))
    if value is None or runs < 2 or run.noise is None:
        return _num(value)
    half = run.noise.half_width(value, runs, Where(o.candidate, level))
    return f"{value:,.1f} +- {half:,.1f} ({runs})"


def provenance(run: TuneRun, outcome: Outcome, objective: str,
               snapshot: HostSnapshot) -> str:
    value = score(outcome, objective, run.spec)
    lines = [
        f"Tuned by gpuserve tune {run.spec.name} ({run.spec.source.name}): best {objective}",
        f"  {value:,.1f} tok/s ({objective})" if value is not None else "",
        f"host {snapshot.host}, SGLang {snapshot.sglang_version}, lock {snapshot.lock}",
        f"measured {outcome.timestamp}; candidate {outcome.candidate}: {outcome.label}",
        "records:", *[f"  {r}" for r in outcome.records],
    ]
    return "".join(f"# {line}\n" for line in lines if line)


#: PyYAML's line width for a winner profile: wide enough that no value is folded.
UNFOLDED = 1 << 16


def winner_text(run: TuneRun, outcome: Outcome, objective: str, snapshot: HostSnapshot,
                directory: Path, knobs) -> str:
    fields: dict = {}
    extra: list[str] = []
    by_name = {k.name: k for k in knobs}
    for knob_name, label in outcome.choice.items():
        knob = by_name.get(knob_name)
        value = next((v for v in knob.values if v.label == label), None) if knob else None
        if value is None:
            raise GpuserveError(f"tune {run.spec.name}: knob {knob_name}={label} of "
                                f"{outcome.candidate} is no longer in the tune file")
        fields.update(value.fields)
        extra.extend(value.extra_args)
    doc: dict = {"extends": os.path.relpath(run.spec.incumbent, directory.resolve()),
                 "description": f"{run.spec.name}: best {objective} ({outcome.label})"}
    doc.update(nested(fields))
    if extra:
        from gpuserve.launch.profiles import load_profile

        doc["extra_args"] = [*load_profile(run.spec.incumbent).extra_args, *extra]
    # one line a value, however long (a combination's description is): PyYAML folds
    # plain scalars at 80 columns, and a folded description greps as two
    return provenance(run, outcome, objective, snapshot) + yaml.safe_dump(
        doc, sort_keys=False, default_flow_style=False, width=UNFOLDED)


def plot(run: TuneRun, path: Path) -> Path | None:
    """Pareto front and throughput against concurrency, one PNG; None without
    matplotlib (optional, like gpuserve compare --plot)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    fig = Figure(figsize=(12, 5))
    left, right = fig.subplots(1, 2)
    for o in run.outcomes:
        pts = sorted(o.levels.items())
        xs = [c for c, f in pts if isinstance(f.get("output_throughput"), int | float)]
        ys = [f["output_throughput"] for c, f in pts
              if isinstance(f.get("output_throughput"), int | float)]
        if xs:
            right.plot(xs, ys, marker="o", label=o.label[:40])
            left.scatter([y / x for x, y in zip(xs, ys, strict=True)],
                         [y / max(o.gpus, 1) for y in ys], s=12)
    front = pareto_front(run.outcomes)
    if front:
        left.plot([p[0] for p in front], [p[1] for p in front], color="black",
                  label="Pareto front")
    left.set_xlabel("output tok/s per user")
    left.set_ylabel("output tok/s per GPU")
    left.legend(fontsize=7)
    right.set_xlabel("concurrency")
    right.set_ylabel("output tok/s")
    right.set_xscale("log", base=2)
    right.legend(fontsize=6)
    fig.suptitle(f"tune {run.spec.name}")
    fig.savefig(path)
    return path


def summary(run: TuneRun) -> list[str]:
    t = run.tally
    spec: TuneSpec = run.spec
    lines = [f"tune {spec.name}: {t.generated} candidates generated, {t.pruned} pruned "
             f"before loading, {t.measured} measured ({t.stopped} stopped early), "
             f"{t.failed} failed (at start or under load), {t.reused} from earlier "
             f"records; {t.loads} loads used" + (f"; {t.budget_hit}" if t.budget_hit else "")]
    for objective in spec.objectives:
        top = run.best(objective.name)
        value = score(top, objective.name, spec) if top else None
        gain = run.gain(objective.name)
        lines.append(f"best {objective.name}: " + (
            f"{value:,.1f} tok/s: {top.label} ({top.candidate})" if top and value is not None
            else "none") + (f"; {gain}" if gain else ""))
    if run.noise is not None:
        lines.append(f"run-to-run noise: {100 * run.noise.rel_sd:.2f} % per benchmark run "
                     f"({run.noise.dof} degrees of freedom); intervals are one-sided 95 %; "
                     f"{run.tally.repeats} rounds of repeated runs in loaded servers "
                     f"({run.tally.repeat_runs} benchmark runs, no load)")
    front = pareto_front(run.outcomes)
    if spec.objective("pareto") and front:
        lines.append("Pareto front (tok/s per user, tok/s per GPU, concurrency, candidate): "
                     + "; ".join(f"{u:.1f}, {g:.1f}, c{c}, {n}" for u, g, c, n in front))
    return lines
