"""What happened to each candidate, and what the objectives make of it.

An outcome is ``measured``, ``stopped``, ``failed`` or ``pruned``, stored as one JSON
file per candidate (``gpuserve.tune-candidate/1``) beside the bench records it points
to, so a tune is its records and a rerun measures only what has none. The objectives
(``single_stream``, ``goodput``, ``pareto``) pick from those outcomes.

How: docs/tune.md, "gpuserve.tune.outcome: outcomes" and "Objectives"
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpuserve.tune.space import TuneSpec

SCHEMA = "gpuserve.tune-candidate/1"
class OutcomeStatus(StrEnum):
    """A candidate's outcome (a StrEnum: the stored document keeps the word)."""

    MEASURED = "measured"
    STOPPED = "stopped"  # measured, then stopped early (its reason says why)
    FAILED = "failed"  # the start or the deploy failed; the host was rolled back
    PRUNED = "pruned"  # judged before loading, never started


STATUSES = tuple(OutcomeStatus)


class LoadStatus(StrEnum):
    """How one load of a candidate went (a StrEnum: prints as its word)."""

    OK = "ok"
    FAILED = "failed"  # the start or the deploy failed; the host was rolled back
    REFUSED = "refused"  # refused before any change (the preflight)
FIGURES = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms",
           "p99_itl_ms", "mean_ttft_ms", "mean_itl_ms", "median_tpot_ms", "p99_tpot_ms",
           "mean_tpot_ms")


@dataclass
class Outcome:
    candidate: str
    phase: str
    choice: dict[str, str]
    status: OutcomeStatus
    gpus: int = 1
    levels: dict[int, dict[str, Any]] = field(default_factory=dict)
    reason: str = ""
    numbers: dict[str, Any] = field(default_factory=dict)
    prediction: dict[str, Any] | None = None
    load_s: float | None = None
    diagnosis: dict[str, Any] | None = None
    records: list[str] = field(default_factory=list)
    timestamp: str = ""

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.choice.items()) or "incumbent"

    @property
    def loaded(self) -> bool:
        """Whether the server was started for it (a load spent)."""
        return (self.status in (OutcomeStatus.MEASURED, OutcomeStatus.STOPPED,
                                OutcomeStatus.FAILED) and self.reason != "refused")

    def figure(self, level: int, name: str = "output_throughput") -> float | None:
        value = self.levels.get(level, {}).get(name)
        return float(value) if isinstance(value, int | float) else None

    @property
    def single(self) -> float | None:
        return self.figure(1)

    def runs(self, level: int) -> list[float]:
        """Output tok/s of each benchmark run at ``level`` (one when not repeated)."""
        stored = (self.numbers.get("runs") or {}).get(str(level))
        if isinstance(stored, list) and stored:
            return [float(v) for v in stored if isinstance(v, int | float)]
        value = self.figure(level)
        return [value] if value is not None else []

    def count(self, level: int | None) -> int:
        return max(1, len(self.runs(level))) if level is not None else 1

    def to_dict(self, tune: str) -> dict:
        return {"schema": SCHEMA, "tune": tune, "candidate": self.candidate,
                "phase": self.phase, "choice": self.choice, "status": self.status,
                "gpus": self.gpus,
                "levels": {str(k): v for k, v in sorted(self.levels.items())},
                "reason": self.reason, "numbers": self.numbers,
                "prediction": self.prediction, "load_s": self.load_s,
                "diagnosis": self.diagnosis, "records": self.records,
                "timestamp": self.timestamp}


def from_dict(doc: dict) -> Outcome | None:
    """An outcome from its stored document; None when it is not one (or is damaged:
    the candidate is then measured again)."""
    try:
        if doc.get("schema") != SCHEMA or doc.get("status") not in STATUSES:
            return None
        return Outcome(candidate=str(doc["candidate"]), phase=str(doc["phase"]),
                       choice={str(k): str(v) for k, v in doc["choice"].items()},
                       status=OutcomeStatus(doc["status"]), gpus=int(doc.get("gpus") or 1),
                       levels={int(k): dict(v) for k, v in doc.get("levels", {}).items()},
                       reason=str(doc.get("reason") or ""),
                       numbers=dict(doc.get("numbers") or {}),
                       prediction=doc.get("prediction"), load_s=doc.get("load_s"),
                       diagnosis=doc.get("diagnosis"), records=list(doc.get("records") or []),
                       timestamp=str(doc.get("timestamp") or ""))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


# ----------------------------------------------------------------------------- objectives


def meets(figures: dict[str, Any], slo: dict[str, float]) -> bool:
    for name, limit in slo.items():
        value = figures.get(name)
        if not isinstance(value, int | float) or value > limit:
            return False
    return True


def goodput(outcome: Outcome, slo: dict[str, float]) -> tuple[float | None, int | None]:
    """(highest output tok/s over the levels that met ``slo``, at which concurrency)."""
    best: tuple[float | None, int | None] = (None, None)
    for level, figures in sorted(outcome.levels.items()):
        tok = figures.get("output_throughput")
        if isinstance(tok, int | float) and meets(figures, slo) and (
                best[0] is None or tok > best[0]):
            best = (float(tok), level)
    return best


def points(outcome: Outcome) -> list[tuple[float, float, int]]:
    """(tok/s per user, tok/s per GPU, concurrency) of each measured level."""
    out = []
    for level, figures in sorted(outcome.levels.items()):
        tok = figures.get("output_throughput")
        if isinstance(tok, int | float) and tok > 0:
            out.append((tok / level, tok / max(outcome.gpus, 1), level))
    return out


def pareto_front(outcomes: list[Outcome]) -> list[tuple[float, float, int, str]]:
    """Points no other point beats on both axes, by tok/s per user descending."""
    every = [(u, g, c, o.candidate) for o in outcomes for (u, g, c) in points(o)]
    front = [p for p in every
             if not any(q[0] >= p[0] and q[1] >= p[1] and (q[0] > p[0] or q[1] > p[1])
                        for q in every)]
    return sorted(front, key=lambda p: -p[0])


def score(outcome: Outcome, objective: str, spec: TuneSpec) -> float | None:
    """The figure an objective ranks by (higher is better); None: no figure."""
    return score_level(outcome, objective, spec)[0]


def score_level(outcome: Outcome, objective: str, spec: TuneSpec
                ) -> tuple[float | None, int | None]:
    """(the figure an objective ranks by, the load level it comes from)."""
    if outcome.status not in (OutcomeStatus.MEASURED, OutcomeStatus.STOPPED):
        return None, None
    if objective == "single_stream":
        return outcome.single, 1
    if objective == "goodput":
        obj = spec.objective("goodput")
        return goodput(outcome, obj.slo if obj else {})
    pts = points(outcome)
    top = max(pts, key=lambda p: p[1], default=None)
    return (top[1], top[2]) if top else (None, None)


def best(outcomes: list[Outcome], objective: str, spec: TuneSpec) -> Outcome | None:
    ranked = [(s, o) for o in outcomes if (s := score(o, objective, spec)) is not None]
    if objective == "pareto":
        front = {p[3] for p in pareto_front(outcomes)}
        ranked = [(s, o) for s, o in ranked if o.candidate in front]
    return max(ranked, key=lambda t: t[0])[1] if ranked else None


def primary(spec: TuneSpec) -> str:
    return spec.objectives[0].name
