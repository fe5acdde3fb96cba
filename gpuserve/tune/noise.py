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
from dataclasses import dataclass
from typing import NamedTuple

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
                  where: tuple[Where, Where] | None = None) -> bool:
        """Whether ``a`` and ``b`` (means) differ beyond the noise."""
        return abs(a - b) > self.z * math.hypot(self.se(a, runs_a), self.se(b, runs_b))

    def beats(self, a: float, runs_a: int, b: float, runs_b: int,
              where: tuple[Where, Where] | None = None) -> bool:
        """Whether ``a`` is higher than ``b`` beyond the noise."""
        return a - b > self.z * math.hypot(self.se(a, runs_a), self.se(b, runs_b))

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
                  where: tuple[Where, Where] | None = None) -> bool:
        if where is None:
            return self.pool.separated(a, runs_a, b, runs_b)
        se, dof = self.spread(a, runs_a, b, runs_b, where)
        return abs(a - b) > t95(dof) * se

    def beats(self, a: float, runs_a: int, b: float, runs_b: int,
              where: tuple[Where, Where] | None = None) -> bool:
        if where is None:
            return self.pool.beats(a, runs_a, b, runs_b)
        se, dof = self.spread(a, runs_a, b, runs_b, where)
        return a - b > t95(dof) * se

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
