"""`gpuserve tune` on the lab host on the surfaces other than the field notes' box
(tests/lab/test_tune.py has that one, and what is asserted and why): on every shipped
surface but pcie-draft-graphs the lab tune file searches within its budget and picks
that surface's optimum, or what the measured noise cannot tell from it; on
pcie-draft-graphs a small tune file shows EAGLE-3, which fails alone at graph max bs
512, retried beside 128 and measured.

A module of its own so that `make test` runs it beside test_tune.py, on another host.
It brings the host to what it needs itself (`serving`): the host deploy on a bare lab,
then the serve deploy of the inventory profile.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from labhelpers import healthy, serve_inventory_profile, served_profile, tune
from tunejudge import judge_pick, outcomes, surface_truth

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
TUNE = REPO / "tests/fixtures/tune/lab.tune.yaml"
RETRY = REPO / "tests/fixtures/tune/lab-retry.tune.yaml"
SURFACES = sorted(p.stem for p in (REPO / "lab/surfaces").glob("*.yaml"))


@pytest.fixture(scope="module")
def serving(lab):
    """The host serving its inventory profile, whatever ran before (labhelpers)."""
    serve_inventory_profile(lab)


# fleet.yaml is the lab fleet's (tests/lab/test_fleet.py), not a tuning surface: its one
# slower setting (decode graphs off) is not in the tune file's space
@pytest.mark.parametrize("surface", [s for s in SURFACES if s not in (
    "field-notes", "pcie-draft-graphs", "fleet")] or
                         [pytest.param("second", marks=pytest.mark.skip(
                             reason="no second surface shipped in lab/surfaces"))])
def test_finds_another_surfaces_optimum_within_budget(lab, serving, tmp_path, surface
                                                      ) -> None:
    """The same tune file on a surface with another optimum, within its budget: the
    single-stream pick and the highest measured throughput are that surface's optimum
    over the whole space (within 2 %: the stand-in's timings are real), or as close to
    it as the noise this machine showed can resolve (:func:`judge_pick`)."""
    rc, out = tune(lab, tmp_path, surface, TUNE)
    assert rc == 0, out[-6000:]
    assert "budget of" not in out, out[-3000:]  # found within the budget
    docs = list(outcomes(tmp_path).values())
    judge_pick(out, docs, "single_stream", surface_truth(surface, TUNE, "single_stream"))
    # the tune file names no throughput objective (pareto): its measured top is judged
    judge_pick(out, docs, "throughput", surface_truth(surface, TUNE, "throughput"),
               reported=False)


def test_a_value_failing_alone_is_retried_beside_what_relieves_it(lab, serving,
                                                                  tmp_path) -> None:
    """pcie-draft-graphs: EAGLE-3 dies capturing graphs at the incumbent's 512 (SGLang's
    capture OOM, rolled back) and starts at 128, where it is the single-stream optimum;
    the tune retries it beside 128, measures it and picks it (or says the gain is within
    the noise the machine showed). (The surface's optimum over
    the lab tune file is bench/tune_surface.py's; a small tune file keeps this cheap.)"""
    rc, out = tune(lab, tmp_path, "pcie-draft-graphs", RETRY)
    assert rc == 0, out[-6000:]
    docs = outcomes(tmp_path, "lab-retry")
    alone = next(d for d in docs.values() if d["phase"] == "one knob"
                 and "speculative" in d["choice"])
    # SGLang's capture OOM ("Capture cuda graph failed: CUDA out of memory"), read back
    # from the journal by the startup-log diagnosis
    assert alone["status"] == "failed", alone
    assert alone["diagnosis"]["outcome"] == "oom-during-capture", alone
    retry = next(d for d in docs.values() if d["phase"] == "retry")
    assert retry["status"] == "measured", retry
    assert retry["choice"]["memory.cuda_graph_max_bs"] == "128"
    # picked where the measured noise resolves its gain; else the tune says "no
    # significant gain" and keeps the incumbent (a busy shared runner's noise)
    judge_pick(out, list(docs.values()), "single_stream",
               surface_truth("pcie-draft-graphs", RETRY, "single_stream"))
    assert served_profile(lab) == "glm5-nvfp4-tp8" and healthy(lab)
