"""The statistics of a tune under noise: how many runs tell a gain from the noise, and
the race that spends repeats where the pick is undecided.

Purpose-built cases: seeded normal draws with a known standard deviation (the test's
own, no surface), and a fake host whose every benchmark run is drawn around a fixed
speed per launch (tests/unit/tune/test_search.py's ``FakeHost`` with seeded noise).
"""

from __future__ import annotations

import random

import pytest

from gpuserve.tune.noise import Noise, pooled
from gpuserve.tune.report import summary
from gpuserve.tune.search import Measurement
from tests.unit.tune.test_search import FakeHost, snapshot, tuned  # noqa: F401 (fixture)


def test_runs_needed_follows_the_sample_size_of_a_two_sample_comparison() -> None:
    """n = 2 ((z95 + z80) sd / resolution)^2: 2 % noise and a 2 % resolution need 13
    runs each; half the resolution four times as many; no noise, one run."""
    assert Noise(0.02, 30).runs_needed(0.02) == 13
    assert Noise(0.02, 30).runs_needed(0.01) == 50
    assert Noise(0.01, 30).runs_needed(0.02) == 4
    assert Noise(0.0, 10).runs_needed(0.02) == 1


def _trial(rng: random.Random, gain: float, sd: float, runs: int) -> bool:
    """One comparison: ``runs`` runs of a baseline at 100 and of a challenger at
    100 (1 + gain), each run drawn with relative sd; the noise is pooled from both, as a
    tune pools it, and the challenger must beat the baseline beyond it."""
    base = [100 * rng.gauss(1, sd) for _ in range(runs)]
    challenger = [100 * (1 + gain) * rng.gauss(1, sd) for _ in range(runs)]
    noise = pooled([base, challenger])
    return noise.beats(sum(challenger) / runs, runs, sum(base) / runs, runs)


def test_a_gain_of_the_resolution_is_found_four_times_in_five() -> None:
    """At the runs :meth:`Noise.runs_needed` asks for, a true 2 % gain under 2 % noise
    passes the test about 80 % of the time, and no gain about 5 % (one-sided 95 %):
    the interval uses the pooled estimate and Student's t for its degrees of freedom."""
    rng = random.Random(7)
    runs = Noise(0.02, 100).runs_needed(0.02)
    found = sum(_trial(rng, 0.02, 0.02, runs) for _ in range(2000)) / 2000
    false = sum(_trial(rng, 0.0, 0.02, runs) for _ in range(2000)) / 2000
    assert 0.74 < found < 0.88, found
    assert false < 0.07, false
    # with three runs (the noise estimate alone) the same gain is found less than half
    # the time: why the incumbent and the contenders run more
    few = sum(_trial(rng, 0.02, 0.02, 3) for _ in range(2000)) / 2000
    assert few < 0.45, few


#: single-stream tok/s per launch: 256 is 4.1 % over the incumbent (128), 512 4.7 % below
SPEEDS = {"incumbent": 86.0, "memory.cuda_graph_max_bs=256": 89.5,
          "memory.cuda_graph_max_bs=512": 82.0}


class NoisyHost(FakeHost):
    """The fake host (its loads, calibration and calls) at :data:`SPEEDS`, each
    benchmark run drawn with a relative sd (seeded)."""

    def __init__(self, sd: float, seed: int):
        super().__init__()
        self.rng, self.sd, self.repeats = random.Random(seed), sd, []

    def measure(self, candidate, profile, levels, first, repeat=1) -> Measurement:
        m = super().measure(candidate, profile, levels, first, repeat)
        if not first:
            self.repeats.append((candidate.label, repeat))
        for c, figures in m.levels.items():
            m.runs[c] = [{**figures, "output_throughput": SPEEDS[candidate.label] * c
                          * self.rng.gauss(1, self.sd)} for _ in range(repeat)]
            m.levels[c] = m.runs[c][-1]
        return m


RACE = """knobs:
  memory.cuda_graph_max_bs: [128, 256, 512]
loads: [1]
objectives:
  single_stream: {}
budget: {loads: 4}
"""


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_repeats_race_where_the_pick_is_undecided(snapshot, tmp_path, seed) -> None:  # noqa: F811
    """Graph max bs 256 is 4.1 % over the incumbent (128), 512 is 4.7 % below. Under
    2 % noise the incumbent runs three times for
    the noise, then more, in its one server, up to the baseline's runs; the leader
    runs until it has a contender's runs; a launch far below the leader stops once it is
    separated; no repeat ever loads; and 256 beats the incumbent beyond the noise."""
    host = NoisyHost(0.02, seed)
    run, lines, _ = tuned(snapshot, tmp_path, RACE, host)
    by = {o.label: o for o in run.outcomes}
    assert host.loads == 3  # the incumbent and two one-knob launches: repeats load nothing
    incumbent = [r for label, r in host.repeats if label == "incumbent"]
    # more rounds only as the noise estimate firms up
    assert 1 <= len(incumbent) <= 4 and 3 < len(run.incumbent.runs(1)) <= 20
    leader = by["memory.cuda_graph_max_bs=256"]
    assert len(run.incumbent.runs(1)) > len(leader.runs(1)) > 1
    assert len(by["memory.cuda_graph_max_bs=512"].runs(1)) < len(leader.runs(1))
    assert run.best("single_stream") is leader
    assert run.gain("single_stream").endswith("over the incumbent")
    assert any("the baseline every candidate is compared with" in line for line in lines)
    # the summary counts them: every repeated run, none of them a load
    assert run.tally.repeat_runs == sum(r for _, r in host.repeats)
    assert any(f"({run.tally.repeat_runs} benchmark runs, no load)" in line
               for line in summary(run))


def test_no_noise_no_repeats(snapshot, tmp_path) -> None:  # noqa: F811
    """Noise-free (every run equal): the incumbent's three runs measure a zero noise and
    nothing runs again: each difference is beyond it."""
    host = NoisyHost(0.0, 0)
    run, _, _ = tuned(snapshot, tmp_path, RACE, host)
    assert run.noise.rel_sd == 0 and host.repeats == [] and run.tally.repeat_runs == 0
    assert len(run.incumbent.runs(1)) == 3
    assert run.best("single_stream").label == "memory.cuda_graph_max_bs=256"


def test_a_round_fits_one_bench_section(snapshot, tmp_path) -> None:  # noqa: F811
    """At 30 % noise and ``repeats.most`` 50 the incumbent asks for 100 runs: they come
    in rounds of at most 64 scenarios (a bench section's limit), never one deploy that
    the profile loader would refuse."""
    from gpuserve.launch.bench import MAX_SCENARIOS

    host = NoisyHost(0.3, 4)
    body = RACE.replace("budget: {loads: 4}", "budget: {loads: 4}\nrepeats: {most: 50}")
    run, _, _ = tuned(snapshot, tmp_path, body, host)
    assert host.repeats and all(r <= MAX_SCENARIOS for _, r in host.repeats)
    assert len(run.incumbent.runs(1)) > MAX_SCENARIOS



def _state(elapsed: float, planned: int, wall: float | None):
    """What ``_room_for`` reads of a tune: GLM-5's requests (2 x 256 output tokens per
    level), a 600 s load, the incumbent at 225 tok/s at concurrency 64."""
    from types import SimpleNamespace as NS

    incumbent = NS(phase="incumbent", levels={64: {"output_throughput": 225.0}})
    spec = NS(budget=NS(wall_s=wall, loads=10), prompts_per_level=2, output_len=256,
              loads=(64,))
    return NS(spec=spec, ctx=NS(load_estimate_s=600.0), first_load_s=None,
              outcomes=[incumbent], planned=planned, index=1, tally=NS(loads=1),
              elapsed=lambda: elapsed), incumbent


def test_repeats_leave_the_wall_budget_time_for_the_loads() -> None:
    """A round of repeated runs fits only while the wall budget keeps, for every load
    still planned, its start and one run per level: at concurrency 64 a run is 128
    requests of 256 tokens at 225 tok/s (146 s), a load 600 s. Without a wall budget
    every round fits."""
    from gpuserve.tune.search import _room_for

    st, incumbent = _state(elapsed=1000.0, planned=6, wall=7200.0)
    # five loads left: 5 x (600 + 146) = 3729 s; 1000 + 3729 + n x 146 <= 7200
    assert _room_for(st, incumbent, (64,), 16)
    assert not _room_for(st, incumbent, (64,), 17)
    st, incumbent = _state(elapsed=1000.0, planned=6, wall=None)
    assert _room_for(st, incumbent, (64,), 1000)
