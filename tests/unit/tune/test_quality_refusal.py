"""A tune whose fastest candidate fails its quality check: refused whatever its speed,
shown as such in the table, and the best is the fastest candidate that passed.

The fake host (test_search.py's) makes graph max bs 256 the fastest launch (x 1.1);
then its deploy fails the quality check, as roles/checks/quality.py reports it.
"""

from __future__ import annotations

from gpuserve.commands.tune import _failure_reason
from gpuserve.tune.report import table
from tests.unit.tune.test_search import SPACE, FakeHost, Measurement, tuned
from tests.unit.tune.test_search import snapshot as snapshot  # the fixture

QUALITY_LINE = ("[lab-gpu] quality: profile c2 failed its quality check: non_finite_logprobs "
                "96 (limit 0): first in completion-0 at token 4 [reference glm-5@abc.json]")


class Bs256Fastest(FakeHost):
    """Graph max bs 256 is the fastest launch (x 1.1); ``broken``: its deploy fails the
    quality check instead."""

    def __init__(self, broken: bool):
        super().__init__()
        self.broken = broken

    def measure(self, candidate, profile, levels, first, repeat=1) -> Measurement:
        m = super().measure(candidate, profile, levels, first, repeat)
        if "=256" not in candidate.label:
            return m
        if self.broken:
            return Measurement("failed", reason=_failure_reason(QUALITY_LINE)
                               + "; rolled back to glm5-nvfp4-tp8")
        for figures in m.levels.values():
            figures["output_throughput"] *= 1.1
        return m


def test_the_deploys_quality_failure_is_the_candidates_reason():
    assert _failure_reason(QUALITY_LINE).startswith(
        "quality: profile c2 failed its quality check: non_finite_logprobs 96 (limit 0)")


def test_a_fast_broken_launch_is_refused_and_the_fastest_passing_one_wins(snapshot, tmp_path):
    healthy, _, _ = tuned(snapshot, tmp_path, SPACE, Bs256Fastest(broken=False))
    assert healthy.best("single_stream").label == "memory.cuda_graph_max_bs=256"
    (tmp_path / "broken").mkdir()
    run, _, _ = tuned(snapshot, tmp_path / "broken", SPACE, Bs256Fastest(broken=True))
    broken = next(o for o in run.outcomes if o.label == "memory.cuda_graph_max_bs=256")
    assert broken.status == "failed" and "non_finite_logprobs" in broken.reason
    best = run.best("single_stream")
    assert best.single == max(o.single for o in run.outcomes
                              if o.single is not None and o.status != "failed")
    row = next(r for r in table(run) if r.startswith("memory.cuda_graph_max_bs=256"))
    assert "refused: quality" in row and "non_finite_logprobs" in row
