"""Run-to-run noise: how far one benchmark run is from the next, and what beats what.

Why: on a real GPU box two runs of the same launch differ by 1-3 %, so one run per
candidate picks a lucky launch about as often as a better one. The incumbent's load
levels run several times in the same server; every repeated run of any candidate adds
to one pooled estimate of the relative standard deviation of a run on this host. A
candidate's figure is the mean of its runs, with an interval of Student's t (one-sided
95 %, for the estimate's degrees of freedom) standard errors; two candidates are told
apart only when their difference passes the same test.

How: docs/tune.md, "Noise, repeats and significance"
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

#: Student's t, one-sided 95 %, by degrees of freedom (a noise estimate from a few runs
#: is itself uncertain: fewer runs, a wider band); beyond the table the normal's 1.645
_T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860,
        9: 1.833, 10: 1.812, 12: 1.782, 15: 1.753, 20: 1.725, 30: 1.697, 60: 1.671}
Z = 1.645
#: the normal's one-sided 80 % quantile: a gain of the resolution is found 4 times in 5
POWER_Z = 0.8416


def t95(dof: int) -> float:
    """Student's t quantile (one-sided 95 %) for ``dof`` degrees of freedom (rounded to
    the next smaller tabled value: the wider band)."""
    known = [d for d in _T95 if d <= max(dof, 1)]
    return _T95[max(known)] if dof <= 60 else Z


@dataclass(frozen=True)
class Noise:
    """The pooled relative standard deviation of one run, and its degrees of freedom."""

    rel_sd: float
    dof: int

    @property
    def z(self) -> float:
        return t95(self.dof)

    def se(self, value: float, runs: int) -> float:
        """Standard error of a mean of ``runs`` runs around ``value``."""
        return abs(value) * self.rel_sd / math.sqrt(max(runs, 1))

    def half_width(self, value: float, runs: int) -> float:
        return self.z * self.se(value, runs)

    def separated(self, a: float, runs_a: int, b: float, runs_b: int) -> bool:
        """Whether ``a`` and ``b`` (means) differ beyond the noise."""
        return abs(a - b) > self.z * math.hypot(self.se(a, runs_a), self.se(b, runs_b))

    def beats(self, a: float, runs_a: int, b: float, runs_b: int) -> bool:
        """Whether ``a`` is higher than ``b`` beyond the noise."""
        return a - b > self.z * math.hypot(self.se(a, runs_a), self.se(b, runs_b))

    def runs_needed(self, resolution: float) -> int:
        """Runs of each of two launches for which a relative gain of ``resolution``
        passes :meth:`beats` four times in five: n = 2 ((z95 + z80) sd / resolution)^2
        (the usual sample size of a two-sample comparison, planned with the normal's
        quantiles and the host's sd; the test itself then uses Student's t)."""
        if self.rel_sd <= 0:
            return 1
        return max(1, math.ceil(2 * ((Z + POWER_Z) * self.rel_sd / resolution) ** 2))


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
