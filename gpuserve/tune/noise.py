"""Run-to-run noise: how far one benchmark run is from the next, and what beats what.

Why: on a real GPU box two runs of the same launch differ by 1-3 %, so one run per
candidate picks a lucky launch about as often as a better one. The incumbent's load
levels run several times in the same server; every repeated run of any candidate adds
to one pooled estimate of the relative standard deviation of a run on this host. A
candidate's figure is the mean of its runs, with an interval of Student's t (one-sided
95 %, for the estimate's degrees of freedom) standard errors; two candidates are told
apart only when their difference passes the same test. Over a fleet each host has its
own (:class:`FleetNoise`): hosts of one model may differ in noise, and two hosts'
candidates differ also by the error of the incumbents they were scaled by.

How: docs/tune.md, "Noise, repeats and significance" and "A fleet in parallel"
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import NamedTuple

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


def critical(dof: int, family: int = 1) -> float:
    """The t a difference must pass at ``dof`` degrees of freedom: one-sided at
    :data:`CONFIDENCE`, or, as one of ``family`` such tests of which none should err,
    each at 1/family of the error (Bonferroni)."""
    return t_quantile(1 - (1 - CONFIDENCE) / max(family, 1), dof)


def _power(margin: float, sd_one_run: float, runs_now: int, runs_to: int) -> float:
    """The chance that a mean now ``margin`` above what it must pass stays above it
    after ``runs_to - runs_now`` more runs of standard deviation ``sd_one_run``."""
    spread = sd_one_run * math.sqrt(runs_to - runs_now) / runs_to
    if spread <= 0:
        return 1.0 if margin > 0 else 0.0
    return NormalDist().cdf(margin / spread)


class Where(NamedTuple):
    """Which candidate a figure is of, and at which load level: a fleet's noise
    (:class:`FleetNoise`) tells by it the host that measured it; one host's ignores it."""

    candidate: str
    level: int | None = None


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

    def half_width(self, value: float, runs: int, where: Where | None = None) -> float:
        return self.z * self.se(value, runs)

    def rel_sd_of(self, candidate: str) -> float:
        """The noise a candidate's figures are judged at (one host: the host's)."""
        return self.rel_sd

    def separated(self, a: float, runs_a: int, b: float, runs_b: int,
                  where: tuple[Where, Where] | None = None, family: int = 1) -> bool:
        """Whether ``a`` and ``b`` (means) differ beyond the noise; with ``family``, as
        one of that many such tests of which none should err (:func:`critical`)."""
        return abs(a - b) > critical(self.dof, family) * math.hypot(self.se(a, runs_a),
                                                                    self.se(b, runs_b))

    def beats(self, a: float, runs_a: int, b: float, runs_b: int,
              where: tuple[Where, Where] | None = None) -> bool:
        """Whether ``a`` is higher than ``b`` beyond the noise."""
        return a - b > self.z * math.hypot(self.se(a, runs_a), self.se(b, runs_b))

    def conditional_power(self, a: float, runs_a: int, b: float, runs_b: int,
                          runs_to: int, where: tuple[Where, Where] | None = None) -> float:
        """The chance that ``a`` (a mean of ``runs_a`` runs) beats ``b`` beyond the
        noise once it has ``runs_to`` runs, were its true value its mean now (the
        conditional power of a group-sequential comparison: more runs are futile where
        it is low)."""
        if runs_to <= runs_a:
            return 1.0 if self.beats(a, runs_a, b, runs_b) else 0.0
        need = self.z * math.hypot(self.se(a, runs_to), self.se(b, runs_b))
        return _power(a - b - need, abs(a) * self.rel_sd, runs_a, runs_to)

    def upper(self, confidence: float = PLANNING) -> Noise:
        """The noise at the upper confidence limit of its estimate (chi-square on its
        degrees of freedom): what to plan runs with, where a few runs may have drawn
        it low (3 runs at two levels: 4 degrees of freedom, the limit 1.56 x)."""
        if self.dof <= 0 or self.rel_sd <= 0:
            return self
        return Noise(self.rel_sd * math.sqrt(self.dof / chi2_quantile(1 - confidence,
                                                                       self.dof)), self.dof)

    def runs_needed(self, resolution: float, candidate: str | None = None) -> int:
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


#: the most weight, in degrees of freedom, the other hosts' pooled noise has as a prior
#: for one host's own (:func:`moderated`): what one host's first noise runs give with
#: the defaults (3 runs at two load levels)
PRIOR_DOF = 4
#: the chi-square distribution's 95 % quantile at one degree of freedom: Bartlett's test
#: of two variances (:func:`agree`)
CHI2_95_1 = 3.841


def agree(a: Noise, b: Noise) -> bool:
    """Whether two noise estimates may be one host's noise: Bartlett's test of equal
    variances (two groups, 5 %) does not tell them apart."""
    if a.rel_sd <= 0 or b.rel_sd <= 0:
        return a.rel_sd == b.rel_sd
    dof = a.dof + b.dof
    var = (a.dof * a.rel_sd ** 2 + b.dof * b.rel_sd ** 2) / dof
    stat = dof * math.log(var) - a.dof * math.log(a.rel_sd ** 2) \
        - b.dof * math.log(b.rel_sd ** 2)
    stat /= 1 + (1 / a.dof + 1 / b.dof - 1 / dof) / 3
    return stat <= CHI2_95_1


def moderated(own: Noise | None, prior: Noise | None, prior_dof: int = PRIOR_DOF
              ) -> Noise | None:
    """A host's noise: its own estimate, with the other hosts' pooled one as a prior worth
    at most ``prior_dof`` degrees of freedom while the two agree (:func:`agree`; a
    moderated variance, as in Smyth's empirical-Bayes t test): s^2 = (d0 s0^2 + d s^2) /
    (d0 + d), at d0 + d degrees of freedom. A host's few first runs lean on the fleet's;
    its many later ones outweigh it; a host whose runs say it is noisier or quieter than
    the others stands on its own (Student's t for its own degrees of freedom)."""
    if prior is None or prior_dof <= 0:
        return own
    d0 = min(prior_dof, prior.dof)
    if own is None:
        return Noise(prior.rel_sd, d0)
    if not agree(own, prior):
        return own
    var = (d0 * prior.rel_sd ** 2 + own.dof * own.rel_sd ** 2) / (d0 + own.dof)
    return Noise(math.sqrt(var), d0 + own.dof)


@dataclass(frozen=True)
class FleetNoise:
    """A fleet's noise: each host's (:func:`moderated`), the host each candidate was
    measured on, and each host's incumbent runs per load level (its scale's error).

    A candidate against the incumbent, or against one measured on the same host, is a
    same-host comparison (a host's figures are scaled by its own incumbent): that host's
    noise alone. Two measured on different hosts add, to each host's noise, the error of
    that host's incumbent mean their figures were scaled by (Welch's degrees of
    freedom). Without ``where`` it answers as the pool of every host's runs (shown in
    the summary). docs/tune.md, "A fleet in parallel"."""

    hosts: dict[str, Noise]  # host -> its moderated noise (first: the reference host)
    own: dict[str, Noise | None]  # host -> its own runs' estimate alone (shown)
    where: dict[str, str]  # candidate -> the host that measured it
    incumbent_runs: dict[str, dict[int, int]]  # host -> level -> its incumbent's runs
    incumbent: str  # the incumbent's candidate: measured on every host
    pool: Noise

    @property
    def rel_sd(self) -> float:
        return self.pool.rel_sd

    @property
    def dof(self) -> int:
        return self.pool.dof

    @property
    def z(self) -> float:
        return self.pool.z

    def se(self, value: float, runs: int) -> float:
        return self.pool.se(value, runs)

    def host_of(self, candidate: str) -> str:
        """The host that measured ``candidate`` (the incumbent: the reference host's)."""
        host = self.where.get(candidate)
        return host if host in self.hosts else next(iter(self.hosts))

    def rel_sd_of(self, candidate: str) -> float:
        return self.hosts[self.host_of(candidate)].rel_sd

    def _incumbent_runs(self, host: str, level: int | None, default: int) -> int:
        runs = self.incumbent_runs.get(host) or {}
        if level in runs:
            return runs[level]
        return min(runs.values(), default=default)

    def half_width(self, value: float, runs: int, where: Where | None = None) -> float:
        if where is None:
            return self.pool.half_width(value, runs)
        return self.hosts[self.host_of(where.candidate)].half_width(value, runs)

    def spread(self, a: float, runs_a: int, b: float, runs_b: int,
               where: tuple[Where, Where]) -> tuple[float, int]:
        """The standard error of ``a - b`` and its degrees of freedom."""
        wa, wb = where
        ha, hb = self.host_of(wa.candidate), self.host_of(wb.candidate)
        if wa.candidate == self.incumbent:  # its figure, seen from the other's host
            ha, runs_a = hb, self._incumbent_runs(hb, wa.level, runs_a)
        if wb.candidate == self.incumbent:
            hb, runs_b = ha, self._incumbent_runs(ha, wb.level, runs_b)
        na, nb = self.hosts[ha], self.hosts[hb]
        if ha == hb:
            return math.hypot(na.se(a, runs_a), na.se(b, runs_b)), na.dof
        parts = [(na.se(a, runs_a) ** 2 + na.se(a, self._incumbent_runs(ha, wa.level, 1))
                  ** 2, na.dof),
                 (nb.se(b, runs_b) ** 2 + nb.se(b, self._incumbent_runs(hb, wb.level, 1))
                  ** 2, nb.dof)]
        var = sum(v for v, _ in parts)
        welch = var ** 2 / sum(v ** 2 / max(d, 1) for v, d in parts) if var > 0 else 0
        return math.sqrt(var), max(int(welch), min(na.dof, nb.dof))

    def separated(self, a: float, runs_a: int, b: float, runs_b: int,
                  where: tuple[Where, Where] | None = None, family: int = 1) -> bool:
        if where is None:
            return self.pool.separated(a, runs_a, b, runs_b, family=family)
        se, dof = self.spread(a, runs_a, b, runs_b, where)
        return abs(a - b) > critical(dof, family) * se

    def beats(self, a: float, runs_a: int, b: float, runs_b: int,
              where: tuple[Where, Where] | None = None) -> bool:
        if where is None:
            return self.pool.beats(a, runs_a, b, runs_b)
        se, dof = self.spread(a, runs_a, b, runs_b, where)
        return a - b > t95(dof) * se

    def conditional_power(self, a: float, runs_a: int, b: float, runs_b: int,
                          runs_to: int, where: tuple[Where, Where] | None = None) -> float:
        """:meth:`Noise.conditional_power`, ``a``'s further runs at its host's noise
        and the test at :meth:`spread`'s."""
        if where is None:
            return self.pool.conditional_power(a, runs_a, b, runs_b, runs_to)
        if runs_to <= runs_a:
            return 1.0 if self.beats(a, runs_a, b, runs_b, where) else 0.0
        se, dof = self.spread(a, runs_to, b, runs_b, where)
        return _power(a - b - t95(dof) * se, abs(a) * self.rel_sd_of(where[0].candidate),
                      runs_a, runs_to)

    def upper(self, confidence: float = PLANNING) -> FleetNoise:
        """Every host's noise (and the pool's) at its upper confidence limit
        (:meth:`Noise.upper`): what runs are planned with."""
        return replace(self, hosts={h: n.upper(confidence) for h, n in self.hosts.items()},
                       pool=self.pool.upper(confidence))

    def runs_needed(self, resolution: float, candidate: str | None = None) -> int:
        """A candidate's: its host's; the incumbent's (run on every host): the most any
        host needs."""
        if candidate is None or candidate == self.incumbent or candidate not in self.where:
            return max(n.runs_needed(resolution) for n in self.hosts.values())
        return self.hosts[self.host_of(candidate)].runs_needed(resolution)


def fleet_noise(groups: dict[str, list[list[float]]], where: dict[str, str],
                incumbent_runs: dict[str, dict[int, int]], incumbent: str
                ) -> FleetNoise | None:
    """The fleet's noise from each host's groups of repeated runs (``groups``: host ->
    groups, the reference host first); None without any repeat on any host."""
    pool = pooled(g for host in groups.values() for g in host)
    if pool is None:
        return None
    own = {h: pooled(g) for h, g in groups.items()}
    hosts = {}
    for h in groups:
        others = pooled(g for other, gs in groups.items() if other != h for g in gs)
        hosts[h] = moderated(own[h], others) or pool
    return FleetNoise(hosts, own, where, incumbent_runs, incumbent, pool)


def mean_figures(runs: list[dict]) -> dict:
    """The mean of each numeric figure over the runs of one level (others: the last)."""
    out: dict = {}
    for key in {k for run in runs for k in run}:
        values = [run[key] for run in runs if isinstance(run.get(key), int | float)
                  and not isinstance(run.get(key), bool)]
        out[key] = sum(values) / len(values) if values else runs[-1].get(key)
    return out
