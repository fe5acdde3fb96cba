"""`gpuserve tune` on the lab host: the real driver, the real serve deploy per candidate,
the SGLang stand-in following a performance surface (lab/surfaces/, lab/surface.py).

On the default surface (the field notes' box), with 2 % run-to-run noise drawn by the
stand-in per benchmark run, the tune file tests/fixtures/tune/lab.tune.yaml starts from
decode graph max bs 512, measures the noise, prunes TP8+EP8 at mem_fraction_static 0.78
before loading it (calibrated from the incumbent's own start), rolls back the EAGLE-3
tree-decoding candidate that crashes under load and carries on, and leaves the host on
its inventory profile; a rerun measures nothing. On every other shipped surface but
pcie-draft-graphs the same tune file searches within its budget; on pcie-draft-graphs a
small tune file shows EAGLE-3, which fails alone at graph max bs 512, retried beside 128
and measured.

What a tune picks is asserted as the decision it must take given what it measured
(`judge_pick`), never as a fixed winner: the stand-in decodes at the surface's rate on
this machine's CPUs, so a loaded machine adds its own run-to-run noise (5-8 % per run
seen on a busy 2-core CI machine, against the surface's +9 % for graph max bs 128 over
512). Where the measured noise resolves the surface's differences, the pick is the
surface's optimum (within 2 %); where it does not, the tune must say "no significant
gain" and keep the incumbent, or pick a launch the noise cannot tell from the optimum.

A fleet's parallel tune is tests/lab/test_tune_fleet.py (a module of its own, so that
`make test` runs it beside this one).

The module brings the host to what it needs itself (`serving`): the host deploy on a
bare lab, then the serve deploy of the inventory profile.

Kept cheap: 3 s simulated loads, 32/32-token requests, two load levels; a tune runs
about a dozen deploys, some 110 s (docs/tune.md has the lab's figures,
bench/tune_surface.py).
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from labhelpers import healthy, serve_inventory_profile, served_profile, tune
from tunejudge import MEASURED, figure, judge_reported, measured_noise, runs, spread

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
TUNE = REPO / "tests/fixtures/tune/lab.tune.yaml"
RETRY = REPO / "tests/fixtures/tune/lab-retry.tune.yaml"
SURFACES = sorted(p.stem for p in (REPO / "lab/surfaces").glob("*.yaml"))
# the tune file's TP8+EP8 layout, by its label (+ the mem_fraction_static)
EP8 = "layout=ep=8,a2a_backend=flashinfer,runner_backend=flashinfer_cutlass,mfs="


def outcomes(results: Path, name: str = "lab") -> dict[str, dict]:
    """label -> the tune's record of that candidate."""
    docs = [json.loads(p.read_text())
            for p in (results / f"lab-gpu/tune-{name}").glob("*.json")]
    out = {}
    for doc in docs:
        label = " ".join(f"{k}={v}" for k, v in doc["choice"].items()) or "incumbent"
        out[label] = doc
    return out


def bench_files(results: Path) -> list[Path]:
    return sorted((results / "lab-gpu").glob("*-bench-*.json"))


# launches within this of the surface's optimum count as it (the stand-in's timings are
# real: its HTTP and tokenizing work blur differences of a percent or two)
TOLERANCE = 0.02


def judge_pick(out: str, docs: list[dict], objective: str, truth, *,
               reported: bool = True) -> dict:
    """Assert the pick for ``objective`` is the decision the tune must take given what it
    measured, and what that decision is worth on the surface; returns the picked record.

    With ``reported``, the tune's own "best" line: the measured top, with its gain, or
    the incumbent with "no significant gain", never where the measured gain lies far
    beyond the measured noise. Without, the measured top (an objective the tune does not
    name). Either way ``truth(doc)`` (the surface's noise-free figure and its optimum)
    must put the pick within the tolerance of the optimum, or within what the measured
    noise cannot resolve."""
    noise = measured_noise(out)
    if reported:
        pick = judge_reported(out, docs, objective)
    else:
        pick = max((d for d in docs if d["status"] in MEASURED),
                   key=lambda d: figure(d, objective)[0])
    value, optimum = truth(pick)
    # the surface's optimum, measured as often as the pick at the most
    blur = spread(noise, objective, pick, pick)
    assert value >= optimum * (1 - max(TOLERANCE, blur)), (
        f"{objective}: picked {pick['choice']} at {value:.1f} tok/s on the surface, its "
        f"optimum {optimum:.1f}; measured noise {100 * noise:.2f} % per run, "
        f"{runs(pick, objective)} runs")
    return pick


def surface_truth(surface: str, tune_file: Path, objective: str):
    """``truth(doc) -> (the surface's noise-free figure of the record's launch, the
    surface's optimum over the tune file's whole space)`` for ``objective``
    (lab/surface.py, bench/tune_surface.py: the same evaluation the stand-in serves)."""
    import tempfile

    from gpuserve.tune.session import prepare
    from gpuserve.tune.space import candidate_profile, load_tune
    from lab import surface as surfaces

    bench = _bench_module()
    spec, raw = load_tune(tune_file)
    with tempfile.TemporaryDirectory() as tmp:
        prepared = prepare(spec, raw, bench.snapshot(Path(tmp)), comm=bench.Comm(),
                           log=lambda _: None, stamp=lambda: "")
    loaded = surfaces.load(REPO / "lab/surfaces" / f"{surface}.yaml")
    by_knob = {k.name: {v.label: v for v in k.values} for k in prepared.knobs}
    opt = surfaces.true_optimum(loaded, bench.every_launch(spec, prepared.knobs), objective,
                                concurrencies=spec.loads, input_len=spec.input_len,
                                output_len=spec.output_len, metric="output")

    def truth(doc: dict) -> tuple[float, float]:
        choice = {k: by_knob[k][label] for k, label in doc["choice"].items()}
        launch = bench.launch_of(candidate_profile(spec, choice, "check"))
        value = next((v for v, _, each, _ in opt.ranking if each == launch), None)
        assert value is not None, (f"{doc['choice']} was measured but fails on the "
                                   f"surface {surface}")
        return value, opt.value

    return truth


@pytest.fixture(scope="module")
def serving(lab):
    """The host serving its inventory profile, whatever ran before (labhelpers)."""
    serve_inventory_profile(lab)


@pytest.fixture(scope="module")
def field_notes(lab, serving, tmp_path_factory):
    results = tmp_path_factory.mktemp("tune-results")
    rc, out = tune(lab, results, "field-notes", TUNE, noise=0.02)
    return results, rc, out


def test_single_stream_pick_is_what_the_measured_noise_decides(field_notes) -> None:
    """Graph max bs 128 (on the surface, in output tok/s of the tune file's requests,
    +9 % over the incumbent's 512 and 3.4 % over the next size, 256) is picked where the
    measured noise resolves it; where a loaded machine's noise does not, the tune says
    "no significant gain" and keeps the incumbent."""
    results, rc, out = field_notes
    assert rc == 0, out[-6000:]
    docs = list(outcomes(results).values())
    pick = judge_pick(out, docs, "single_stream",
                      surface_truth("field-notes", TUNE, "single_stream"))
    noise = measured_noise(out)
    incumbent = outcomes(results)["incumbent"]
    if spread(noise, "single_stream", incumbent, incumbent) < 0.034:
        # the noise resolves even the gap to the next graph size: only 128 is right
        assert pick["choice"].get("memory.cuda_graph_max_bs") == "128", pick["choice"]
    winner = results / "lab-gpu/tune-lab/lab-single_stream.yaml"
    text = winner.read_text()
    label = " ".join(f"{k}={v}" for k, v in pick["choice"].items()) or "incumbent"
    assert f"best single_stream ({label})" in text and "# host lab-gpu, SGLang 0.5.23" in text
    if pick["phase"] != "incumbent":
        assert f"cuda_graph_max_bs: {pick['choice']['memory.cuda_graph_max_bs']}" in text
    assert re.search(r"tune: candidate \d+/\d+ \[one knob\] .*elapsed; best single_stream", out)
    # under noise: measured, repeated in the incumbent's server, shown with intervals
    assert re.search(r"tune: run-to-run noise on this host: [\d.]+ % per benchmark run", out)
    # three runs for the noise, then more as the baseline every candidate is compared
    # with (at most twice repeats.most), all in its one server
    assert 3 <= len(incumbent["numbers"]["runs"]["1"]) <= 20, incumbent["numbers"]


def test_prunes_ep_at_mfs_078_before_loading_it(field_notes) -> None:
    results, rc, out = field_notes
    assert rc == 0, out[-6000:]
    ep = outcomes(results)[EP8 + "0.78"]
    assert ep["status"] == "pruned", ep
    assert "Not enough memory" in ep["reason"] and ep["numbers"]["calibrated_rest_gib"] < 0
    # never deployed: no profile file written, no record of it
    assert not (results / f"lab-gpu/tune-lab/profiles/{ep['candidate']}.yaml").exists()
    assert not list((results / "lab-gpu").glob(f"*{ep['candidate']}*"))
    # while EP at 0.83 fits and was measured (attention-DP8 + EP8 at 0.83 is another
    # candidate: pruned, no room)
    ep83 = outcomes(results)[EP8 + "0.83"]
    assert ep83["status"] in ("measured", "stopped"), ep83


def test_rolls_back_a_crashing_candidate_and_carries_on(lab, field_notes) -> None:
    results, rc, out = field_notes
    assert rc == 0, out[-6000:]
    crash = next(d for label, d in outcomes(results).items() if "eagle_topk=2" in label)
    assert crash["status"] == "failed", crash
    assert "illegal memory access" in ((crash["diagnosis"] or {}).get("error") or ""), crash
    after = out.split(f"{crash['candidate']}", 1)[-1]
    # back on a good launch: the serve deploy's own rollback (a crash within its checks:
    # the quality check is the second request) or the tuner's switch back (a crash later)
    assert "rolled back to" in (crash["reason"] or "") or "tune: switching the host back to" in out
    assert "loading and measuring concurrency 1" in after  # the search went on
    # left on the inventory's profile, healthy
    assert "tune: leaving the host on the inventory's profile" in out
    assert served_profile(lab) == "glm5-nvfp4-tp8" and healthy(lab)


def test_rerun_measures_nothing(lab, field_notes) -> None:
    results, rc, _ = field_notes
    assert rc == 0
    before = bench_files(results)
    rc, out = tune(lab, results, "field-notes", TUNE, noise=0.02)
    assert rc == 0, out[-6000:]
    assert "0 measured" in out and "0 loads used" in out, out[-3000:]
    assert "loading and measuring" not in out
    assert bench_files(results) == before


def _optimum(surface: str):
    spec = importlib.util.spec_from_file_location("tune_surface", REPO / "bench/tune_surface.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def _bench_module():
    spec = importlib.util.spec_from_file_location("tune_surface",
                                                  REPO / "bench/tune_surface.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
