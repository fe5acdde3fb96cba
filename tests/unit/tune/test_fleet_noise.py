"""A fleet's noise per host (gpuserve/tune/noise.py ``FleetNoise``, ``moderated``).

The statistical tests draw seeded runs around a known mean with a known spread and
count how often a rule calls two equal launches different: a sound rule does so at
about its nominal rate (5 % one-sided), whatever each host's noise.
"""

from __future__ import annotations

import math
import random

import pytest

from gpuserve.tune.noise import Noise, Where, agree, fleet_noise, moderated, pooled, t95
from gpuserve.tune.predict import Comm
from gpuserve.tune.schedule import Fleet
from gpuserve.tune.search import run_search
from gpuserve.tune.session import prepare
from gpuserve.tune.space import load_tune
from lab import surface as surfaces
from tests.checkpoints import once_in_dir
from tests.unit.tune.test_schedule import BENCH, SURFACES

INC, A1, B1 = "incumbent", "cand-a", "cand-b"


def _runs(rng: random.Random, sd: float, n: int, mean: float = 100.0) -> list[float]:
    return [mean * (1 + rng.gauss(0, sd)) for _ in range(n)]


def _noise(groups: dict[str, list[list[float]]], where: dict[str, str] | None = None):
    return fleet_noise(groups, where or {}, {h: {1: len(g[0])} for h, g in groups.items()},
                       INC)


def test_moderated_leans_on_an_agreeing_prior_for_few_runs_and_not_for_many() -> None:
    prior = Noise(0.02, 40)
    few = moderated(Noise(0.005, 2), prior)  # two runs cannot tell 0.5 % from 2 %
    assert few.dof == 6 and few.rel_sd == pytest.approx(math.sqrt((4 * 4 + 2 * 0.25) / 6)
                                                        * 0.01)
    many = moderated(Noise(0.019, 60), prior)
    assert many.dof == 64 and 0.019 < many.rel_sd < 0.0192
    assert moderated(Noise(0.005, 2), None) == Noise(0.005, 2)
    assert moderated(None, prior) == Noise(0.02, 4)  # no runs of its own: the prior's
    assert moderated(Noise(0.01, 5), Noise(0.012, 2)).dof == 7  # a prior of 2 weighs 2


def test_a_host_whose_runs_disagree_with_the_fleet_stands_on_its_own() -> None:
    assert moderated(Noise(0.005, 60), Noise(0.02, 40)) == Noise(0.005, 60)
    assert moderated(Noise(0.03, 9), Noise(0.01, 9)) == Noise(0.03, 9)
    assert not agree(Noise(0.01, 9), Noise(0.03, 9))
    assert agree(Noise(0.01, 2), Noise(0.03, 2))  # two runs each cannot tell them apart
    assert agree(Noise(0.02, 10), Noise(0.024, 10))
    assert agree(Noise(0.0, 4), Noise(0.0, 4)) and not agree(Noise(0.0, 4), Noise(0.01, 4))


def test_each_host_is_judged_at_its_own_noise() -> None:
    rng = random.Random(1)
    noise = _noise({"a": [_runs(rng, 0.01, 40)], "b": [_runs(rng, 0.03, 40)]},
                   {A1: "a", B1: "b"})
    assert noise.hosts["a"].rel_sd == pytest.approx(0.01, rel=0.3)
    assert noise.hosts["b"].rel_sd == pytest.approx(0.03, rel=0.3)
    assert noise.own["b"] == noise.hosts["b"] and noise.hosts["b"].dof == 39
    assert noise.pool.dof == 78
    # 2 % over the incumbent in 10 runs: beyond host a's noise, within host b's
    assert noise.beats(101.5, 10, 100, 40, (Where(A1, 1), Where(INC, 1)))
    assert not noise.beats(101.5, 10, 100, 40, (Where(B1, 1), Where(INC, 1)))
    # the pool (about 2.2 %) would have called host b's a gain
    assert noise.pool.beats(101.5, 10, 100, 40)
    assert noise.rel_sd_of(B1) == noise.hosts["b"].rel_sd
    assert noise.rel_sd_of(INC) == noise.hosts["a"].rel_sd  # the first host's figure
    # intervals: each candidate's host's; without a candidate the pool's
    assert noise.half_width(100, 4, Where(B1, 1)) > 2 * noise.half_width(100, 4, Where(A1))
    assert noise.half_width(100, 4) == noise.pool.half_width(100, 4)
    # repeats planned per host; the incumbent (on every host) for the noisiest
    assert noise.runs_needed(0.02, A1) < noise.runs_needed(0.02, B1)
    assert noise.runs_needed(0.02, INC) == noise.runs_needed(0.02, B1)


def test_the_incumbent_is_counted_with_the_runs_it_has_on_the_candidates_host() -> None:
    rng = random.Random(2)
    noise = fleet_noise({"a": [_runs(rng, 0.02, 20)], "b": [_runs(rng, 0.02, 20)]},
                        {B1: "b"}, {"a": {1: 20}, "b": {1: 3}}, INC)
    se, dof = noise.spread(103, 10, 100, 20, (Where(B1, 1), Where(INC, 1)))
    sd = noise.hosts["b"].rel_sd
    assert se == pytest.approx(math.hypot(103 * sd / math.sqrt(10), 100 * sd / math.sqrt(3)))
    assert dof == noise.hosts["b"].dof
    # the other way round, the same
    assert noise.spread(100, 20, 103, 10, (Where(INC, 1), Where(B1, 1)))[0] == \
        pytest.approx(se)


def test_candidates_on_different_hosts_carry_both_incumbents_error() -> None:
    rng = random.Random(3)
    noise = _noise({"a": [_runs(rng, 0.01, 3)], "b": [_runs(rng, 0.03, 3)]},
                   {A1: "a", B1: "b", "cand-a2": "a"})
    sa, sb = noise.hosts["a"], noise.hosts["b"]
    se, dof = noise.spread(100, 10, 100, 10, (Where(A1, 1), Where(B1, 1)))
    assert se == pytest.approx(100 * math.sqrt(sa.rel_sd ** 2 * (1 / 10 + 1 / 3)
                                               + sb.rel_sd ** 2 * (1 / 10 + 1 / 3)))
    # Welch's degrees of freedom: between the smaller host's and the sum
    assert min(sa.dof, sb.dof) <= dof <= sa.dof + sb.dof
    # on one host the incumbent's error cancels: only the two candidates' runs count
    same, _ = noise.spread(100, 10, 100, 10, (Where(A1, 1), Where("cand-a2", 1)))
    assert same == pytest.approx(100 * sa.rel_sd * math.sqrt(2 / 10))


def _false_gains(rule, trials: int = 2000, k: int = 10, n: int = 5) -> float:
    """How often a candidate on the noisy host b (3 %), as fast as the incumbent, is
    called faster than the incumbent measured on the quiet host a (1 %): each host's
    noise from its incumbent's runs and, on b, the candidate's."""
    rng = random.Random(7)
    hits = 0
    for _ in range(trials):
        inc_a, inc_b = _runs(rng, 0.01, k), _runs(rng, 0.03, k)
        cand = _runs(rng, 0.03, n)
        scale = (sum(inc_a) / k) / (sum(inc_b) / k)  # the fleet's scale: a's over b's
        hits += rule(sum(cand) / n * scale, sum(inc_a) / k, [inc_a], [inc_b, cand])
    return hits / trials


def test_a_noisy_hosts_equal_candidate_passes_at_the_nominal_rate() -> None:
    def per_host(cand, inc, a, b):
        noise = _noise({"a": a, "b": b}, {B1: "b"})
        return noise.beats(cand, 5, inc, 10, (Where(B1, 1), Where(INC, 1)))

    def pool(cand, inc, a, b):
        return pooled([*a, *b]).beats(cand, 5, inc, 10)

    ours, theirs = _false_gains(per_host), _false_gains(pool)
    assert 0.02 <= ours <= 0.07, ours  # one-sided 95 %: about 5 %
    assert theirs > 0.08 and theirs > 1.5 * ours, (ours, theirs)


def test_two_hosts_equal_candidates_are_told_apart_at_the_nominal_rate() -> None:
    """Two equal launches, each on its own host (1 % and 3 %), scaled by incumbents of
    three runs: with the scale's error, called different about 10 % of the time (two
    sides of 5 %); without it, more often."""
    rng = random.Random(11)
    ours = without = 0
    trials = 2000
    for _ in range(trials):
        inc_a, inc_b = _runs(rng, 0.01, 3), _runs(rng, 0.03, 3)
        runs_a, runs_b = _runs(rng, 0.01, 10), _runs(rng, 0.03, 10)
        a = sum(runs_a) / 10
        b = sum(runs_b) / 10 * (sum(inc_a) / sum(inc_b))
        noise = _noise({"a": [inc_a, runs_a], "b": [inc_b, runs_b]}, {A1: "a", B1: "b"})
        ours += noise.separated(a, 10, b, 10, (Where(A1, 1), Where(B1, 1)))
        sa, sb = noise.hosts["a"], noise.hosts["b"]
        plain = math.hypot(sa.se(a, 10), sb.se(b, 10))
        without += abs(a - b) > t95(min(sa.dof, sb.dof)) * plain
    assert 0.05 <= ours / trials <= 0.13, ours / trials
    assert without > 1.5 * ours, (ours, without)


@pytest.fixture(scope="module")
def snapshot():
    """The lab host's snapshot (bench/tune_surface.py), built once per test process."""
    return once_in_dir("tune_surface.snapshot", BENCH.snapshot)


def test_a_fleet_estimates_each_hosts_noise_from_its_own_runs(snapshot) -> None:
    """Two simulated hosts, one at 1 % and one at 4 % per run: the search's noise is
    each host's, every candidate is placed on the host that measured it, and the
    fleet's lines print both."""
    spec, raw = load_tune(BENCH.TUNE)
    prepared = prepare(spec, raw, snapshot, comm=Comm(105.6, 9.59), log=lambda _: None,
                       stamp=lambda: "")
    path = SURFACES / "h200-nvlink.yaml"
    executors = {}
    for name, sd in (("quiet", 0.01), ("noisy", 0.04)):
        surface = surfaces.load(path)
        surface.noise = {"run": sd, "start": 0.0, "seed": f"5|{name}"}
        executors[name] = BENCH.SurfaceHost(surface, spec)
    lines: list[str] = []
    fleet = Fleet(executors, ordered=True, log=lines.append)
    run = run_search(spec, prepared.knobs, prepared.ctx, fleet, BENCH.Memory())
    noise = run.noise
    assert noise is fleet.noise and set(noise.hosts) == {"quiet", "noisy"}
    assert noise.own["quiet"].rel_sd < 0.02 < noise.own["noisy"].rel_sd
    assert noise.hosts["quiet"].rel_sd < noise.pool.rel_sd < noise.hosts["noisy"].rel_sd
    measured = [o for o in run.outcomes if o.phase != "incumbent" and o.loaded]
    assert {noise.host_of(o.candidate) for o in measured} == {"quiet", "noisy"}
    assert all(noise.host_of(o.candidate) == fleet.where[o.candidate] for o in measured)
    # 1 % and 4 % disagree beyond their runs: each host is judged at its own
    assert noise.hosts == {h: noise.own[h] for h in ("quiet", "noisy")}
    # the lines after the incumbents: each host's own figure, no prior used
    shown = {line.split(":")[1].strip(): float(line.split("noise ")[1].split(" %")[0])
             for line in lines if "run-to-run noise" in line}
    assert shown.keys() == {"quiet", "noisy"} and shown["quiet"] < 2 < shown["noisy"], lines
    assert not any("judged at" in line for line in lines), lines
