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
from statistics import NormalDist

#: the one-sided confidence of every test: a launch beats another beyond the noise when
#: its gain would be that unlikely from the noise alone
CONFIDENCE = 0.95
Z = NormalDist().inv_cdf(CONFIDENCE)
#: the power runs are planned for: a gain of the resolution is found 4 times in 5
POWER = 0.80
POWER_Z = NormalDist().inv_cdf(POWER)
#: the confidence of the upper limit of the noise that plans the runs (Browne's rule:
#: planned with the 80 % upper limit, the runs reach the power they were planned for at
#: least four times in five, where the estimate itself comes from a few runs)
PLANNING = 0.80


def t_quantile(p: float, dof: int) -> float:
    """Student's t quantile ``p`` for ``dof`` degrees of freedom (a noise estimate from
    a few runs is itself uncertain: fewer runs, a wider band). Exact for one and two
    degrees of freedom, the Cornish-Fisher expansion around the normal's quantile
    beyond (within 0.1 % of the tables from three)."""
    nu = max(int(dof), 1)
    if nu == 1:
        return math.tan(math.pi * (p - 0.5))
    if nu == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = NormalDist().inv_cdf(p)
    return (z + (z ** 3 + z) / (4 * nu)
            + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * nu ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * nu ** 3)
            + (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z)
            / (92160 * nu ** 4))


def t95(dof: int) -> float:
    """Student's t quantile (one-sided 95 %) for ``dof`` degrees of freedom."""
    return t_quantile(CONFIDENCE, dof)


def chi2_quantile(p: float, dof: int) -> float:
    """The chi-square quantile ``p`` for ``dof`` degrees of freedom (Wilson and
    Hilferty's cube-root normal approximation: within 1 % from three)."""
    nu = max(int(dof), 1)
    z = NormalDist().inv_cdf(p)
    return nu * (1 - 2 / (9 * nu) + z * math.sqrt(2 / (9 * nu))) ** 3


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

    def separated(self, a: float, runs_a: int, b: float, runs_b: int, family: int = 1
                  ) -> bool:
        """Whether ``a`` and ``b`` (means) differ beyond the noise; with ``family``, as
        one of that many such tests of which none should err (Bonferroni: each at
        1/family of the error)."""
        z = self.z if family <= 1 else t_quantile(1 - (1 - CONFIDENCE) / family, self.dof)
        return abs(a - b) > z * math.hypot(self.se(a, runs_a), self.se(b, runs_b))

    def beats(self, a: float, runs_a: int, b: float, runs_b: int) -> bool:
        """Whether ``a`` is higher than ``b`` beyond the noise."""
        return a - b > self.z * math.hypot(self.se(a, runs_a), self.se(b, runs_b))

    def conditional_power(self, a: float, runs_a: int, b: float, runs_b: int,
                          runs_to: int) -> float:
        """The chance that ``a`` (a mean of ``runs_a`` runs) beats ``b`` beyond the
        noise once it has ``runs_to`` runs, were its true value its mean now (the
        conditional power of a group-sequential comparison: more runs are futile where
        it is low)."""
        if runs_to <= runs_a:
            return 1.0 if self.beats(a, runs_a, b, runs_b) else 0.0
        need = self.z * math.hypot(self.se(a, runs_to), self.se(b, runs_b))
        spread = abs(a) * self.rel_sd * math.sqrt(runs_to - runs_a) / runs_to
        if spread <= 0:
            return 1.0 if a - b > need else 0.0
        return NormalDist().cdf((a - b - need) / spread)

    def upper(self, confidence: float = PLANNING) -> Noise:
        """The noise at the upper confidence limit of its estimate (chi-square on its
        degrees of freedom): what to plan runs with, where a few runs may have drawn
        it low (3 runs at two levels: 4 degrees of freedom, the limit 1.56 x)."""
        if self.dof <= 0 or self.rel_sd <= 0:
            return self
        return Noise(self.rel_sd * math.sqrt(self.dof / chi2_quantile(1 - confidence,
                                                                       self.dof)), self.dof)

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
