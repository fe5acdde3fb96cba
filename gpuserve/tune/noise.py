"""Run-to-run noise: how far one benchmark run is from the next, and what beats what.

Why: on a real GPU box two runs of the same launch differ by 1-3 %, so one run per
candidate picks a lucky launch about as often as a better one. The incumbent's load
levels run several times in the same server; every repeated run of any candidate adds
to one pooled estimate of the relative standard deviation of a run on this host. A
candidate's figure is the mean of its runs, with an interval of ``Z`` standard errors;
two candidates are told apart only when their difference passes the same test.

How: docs/tune.md, "Noise, repeats and significance"
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

#: standard errors of an interval and of a difference that counts (one-sided ~95 %)
Z = 1.645
RUNS_KEY = "runs"  # Outcome.numbers[RUNS_KEY]: {level: [output tok/s of each run]}


@dataclass(frozen=True)
class Noise:
    """The pooled relative standard deviation of one run, and its degrees of freedom."""

    rel_sd: float
    dof: int

    def se(self, value: float, runs: int) -> float:
        """Standard error of a mean of ``runs`` runs around ``value``."""
        return abs(value) * self.rel_sd / math.sqrt(max(runs, 1))

    def half_width(self, value: float, runs: int) -> float:
        return Z * self.se(value, runs)

    def separated(self, a: float, runs_a: int, b: float, runs_b: int) -> bool:
        """Whether ``a`` and ``b`` (means) differ beyond the noise."""
        return abs(a - b) > Z * math.hypot(self.se(a, runs_a), self.se(b, runs_b))

    def beats(self, a: float, runs_a: int, b: float, runs_b: int) -> bool:
        """Whether ``a`` is higher than ``b`` beyond the noise."""
        return a - b > Z * math.hypot(self.se(a, runs_a), self.se(b, runs_b))


def pooled(groups: Iterable[list[float]]) -> Noise | None:
    """The pooled relative standard deviation of every group of repeated runs (runs of
    one launch at one load level in one server); None without any repeat."""
    squares, dof = 0.0, 0
    for runs in groups:
        values = [float(v) for v in runs if isinstance(v, int | float) and v > 0]
        if len(values) < 2:
            continue
        mean = sum(values) / len(values)
        squares += sum(((v - mean) / mean) ** 2 for v in values)
        dof += len(values) - 1
    if dof == 0:
        return None
    return Noise(math.sqrt(squares / dof), dof)


def mean_figures(runs: list[dict]) -> dict:
    """The mean of each numeric figure over the runs of one level (others: the last)."""
    out: dict = {}
    for key in {k for run in runs for k in run}:
        values = [run[key] for run in runs if isinstance(run.get(key), int | float)
                  and not isinstance(run.get(key), bool)]
        out[key] = sum(values) / len(values) if values else runs[-1].get(key)
    return out
