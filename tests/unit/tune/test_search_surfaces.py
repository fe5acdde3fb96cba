"""The search on purpose-built performance surfaces, one per way a one-knob search with
single runs breaks: combinations fed by the first objective only, one noisy run
deciding, a value that fails alone never tried again, and a launch whose predicted room
lies inside the calibration's error loaded first.

Each surface is lab/surface.py data on the field notes' box (its hardware, model and
base figures), with rules written for the case; the executor is the bench's
(bench/tune_surface.py ``SurfaceHost``: each benchmark run drawn with the surface's
seeded noise), the host the lab's (reference box, composed GLM-5 NVFP4 checkpoint).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from gpuserve.tune.predict import Comm
from gpuserve.tune.search import run_search
from gpuserve.tune.session import prepare
from gpuserve.tune.space import load_tune
from lab import surface as surfaces
from tests.checkpoints import once_in_dir

REPO = Path(__file__).resolve().parents[3]
INCUMBENT = REPO / "tests/fixtures/profiles/lab-glm5-graph512.yaml"
EP8 = ("{parallel.ep: 8, moe.a2a_backend: flashinfer, moe.runner_backend: "
       "flashinfer_cutlass, memory.mem_fraction_static: 0.83}")
TREE = ("{speculative.algorithm: EAGLE3, speculative.draft_model: /models/GLM-5-NVFP4, "
        "speculative.num_steps: 3, speculative.eagle_topk: 2, speculative.num_draft_tokens: 4}")
EAGLE = ("{speculative.algorithm: EAGLE3, speculative.draft_model: /models/GLM-5-NVFP4, "
         "speculative.num_steps: 4, speculative.eagle_topk: 1, "
         "speculative.num_draft_tokens: 5}")


def _bench():
    spec = importlib.util.spec_from_file_location("tune_surface_bench",
                                                  REPO / "bench/tune_surface.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BENCH = _bench()


@pytest.fixture(scope="module")
def snapshot():
    """The lab host's snapshot (bench/tune_surface.py), built once per test process."""
    return once_in_dir("tune_surface.snapshot", BENCH.snapshot)


def surface(rules: list[dict], run_noise: float = 0.0, seed: int = 0):
    """The field notes' box with these rules instead of its own."""
    data = surfaces.parse_yaml((REPO / "lab/surfaces/field-notes.yaml").read_text())
    data.update(name="purpose-built", rules=rules,
                noise={"run": run_noise, "start": 0.0, "seed": seed})
    return surfaces.from_data(data, "purpose-built", surfaces.catalog_dests())


def tune(snapshot, tmp_path: Path, body: str, surf):
    path = tmp_path / "t.tune.yaml"
    path.write_text(f"incumbent: {INCUMBENT}\n{body}")
    spec, raw = load_tune(path)
    prepared = prepare(spec, raw, snapshot, comm=Comm(105.6, 9.59), log=lambda _: None,
                       stamp=lambda: "")
    host = BENCH.SurfaceHost(surf, spec)
    return run_search(spec, prepared.knobs, prepared.ctx, host, BENCH.Memory()), host


GRAPHS = {"name": "graphs", "table": {"knob": "cuda_graph_max_bs", "op": "mul",
                                      "interpolate": "log2", "points": {
                                          128: {"decode_tps": 1.0, "batch_decode_tps": 1.04},
                                          512: {"decode_tps": 0.95,
                                                "batch_decode_tps": 1.0}}}}


def test_each_objective_combines_its_own_best_values(snapshot, tmp_path) -> None:
    """EP8 is 2.6 % slower for one stream and the best batch layout; graph max bs 128
    is best for both. Single stream ranks EP8 below the incumbent, so combinations fed
    by it never pair EP8 with 128: the throughput optimum (EP8 + 128, about 4 % over
    EP8 alone) is reached only by the throughput objective's own combination."""
    ep = {"name": "ep", "when": {"ep_size": {"gt": 1}}, "add": {"weights_gb": 5.4},
          "mul": {"decode_tps": 0.974, "batch_decode_tps": 1.2}}
    # EP8 at 512 is 0.974 x the incumbent for one stream: below it
    body = (f"knobs:\n  memory.cuda_graph_max_bs: [128, 512]\n  layout:\n"
            f"    - {{parallel.ep: 1}}\n    - {EP8}\nloads: [1, 8]\n"
            "requests: {input_len: 32, output_len: 32, prompts_per_level: 2}\n"
            "objectives: {single_stream: {}, pareto: {}}\nbudget: {loads: 10}\n")
    run, _ = tune(snapshot, tmp_path, body, surface([GRAPHS, ep]))
    ep_alone = next(o for o in run.outcomes if o.phase == "one knob" and "layout" in o.choice)
    assert ep_alone.single < run.incumbent.single  # slower alone, for one stream
    top = run.best("pareto")
    assert top.phase == "combination" and top.choice["memory.cuda_graph_max_bs"] == "128"
    assert "ep=8" in top.choice["layout"]
    gain = max(f["output_throughput"] for f in top.levels.values()) / max(
        f["output_throughput"] for f in ep_alone.levels.values())
    assert gain > 1.03
    assert run.best("single_stream").label == "memory.cuda_graph_max_bs=128"


def test_noise_is_measured_and_a_gain_must_pass_it(snapshot, tmp_path) -> None:
    """2 % noise per benchmark run. The incumbent (graph max bs 512) is 3.7 % slower for
    one stream than 128, and 256 1 % slower than 512: over ten seeds the pick is 128 at
    least eight times and never 256 (one run each decides wrongly about a quarter of the
    time; at this gain and noise one tune in twenty keeps the incumbent, "no significant
    gain", and these seeds hold two), the noise
    estimate is near 2 %, and runs repeat in the same server, never in another load."""
    rule = {"name": "graphs", "table": {"knob": "cuda_graph_max_bs", "op": "mul",
                                        "points": {128: {"decode_tps": 1.0},
                                                   256: {"decode_tps": 0.953},
                                                   512: {"decode_tps": 0.963}}}}
    body = ("knobs:\n  memory.cuda_graph_max_bs: [128, 256, 512]\nloads: [1]\n"
            "requests: {input_len: 32, output_len: 32, prompts_per_level: 2}\n"
            "objectives: {single_stream: {}}\nbudget: {loads: 5}\n"
            "repeats: {incumbent: 6, most: 10}\n")
    picks = []
    for seed in range(10):
        run, host = tune(snapshot, tmp_path, body, surface([rule], 0.02, seed))
        picks.append(run.best("single_stream").label)
        if picks[-1] == "incumbent":
            assert run.gain("single_stream").startswith("no significant gain")
        assert host.loads == 3 and run.tally.repeats >= 1
        assert 0.005 < run.noise.rel_sd < 0.04
        # repeats.incumbent, then more as the baseline of every comparison (at most
        # twice repeats.most), all in its one load
        assert 6 <= len(run.incumbent.runs(1)) <= 20
    assert picks.count("memory.cuda_graph_max_bs=128") >= 8, picks
    assert "memory.cuda_graph_max_bs=256" not in picks


def test_no_significant_gain_keeps_the_incumbent(snapshot, tmp_path) -> None:
    """A launch 0.3 % faster than the incumbent under 2 % noise is not a winner: the
    report says so and the incumbent stays."""
    rule = {"name": "graphs", "table": {"knob": "cuda_graph_max_bs", "op": "mul",
                                        "points": {128: {"decode_tps": 1.003},
                                                   512: {"decode_tps": 1.0}}}}
    body = ("knobs:\n  memory.cuda_graph_max_bs: [128, 512]\nloads: [1]\n"
            "requests: {input_len: 32, output_len: 32, prompts_per_level: 2}\n"
            "objectives: {single_stream: {}}\nbudget: {loads: 3}\n")
    kept = 0
    for seed in range(5):
        run, _ = tune(snapshot, tmp_path, body, surface([rule], 0.02, seed))
        if run.best("single_stream") is run.incumbent:
            kept += 1
            top = run.outcomes[1]
            if top.single > run.incumbent.single:
                assert run.gain("single_stream").startswith("no significant gain")
    assert kept >= 4


def test_a_value_that_fails_alone_is_retried_where_it_would_fit(snapshot, tmp_path) -> None:
    """EAGLE-3 dies capturing graphs at the incumbent's decode graph max bs 512 and
    starts at 128, where it is the single-stream optimum: the retry pairs it with 128
    (the value that relieves a capture OOM) and measures it."""
    rules = [GRAPHS,
             {"name": "eagle", "when": {"speculative_algorithm": {"ne": None}},
              "mul": {"decode_tps": 1.15}},
             {"name": "draft graphs", "when": {"speculative_algorithm": {"ne": None},
                                               "cuda_graph_max_bs": {"ge": 384}},
              "fail": {"phase": "start", "builtin": "capture_oom"}}]
    body = (f"knobs:\n  memory.cuda_graph_max_bs: [128, 512]\n  speculative: [off, {EAGLE}]\n"
            "loads: [1]\nrequests: {input_len: 32, output_len: 32, prompts_per_level: 2}\n"
            "objectives: {single_stream: {}}\nbudget: {loads: 6}\n")
    run, _ = tune(snapshot, tmp_path, body, surface(rules))
    alone = next(o for o in run.outcomes if o.phase == "one knob" and "speculative" in o.choice)
    assert alone.status == "failed" and "out of memory" in alone.reason.lower()
    retry = next(o for o in run.outcomes if o.phase == "retry")
    assert retry.status == "measured" and retry.choice["memory.cuda_graph_max_bs"] == "128"
    assert run.best("single_stream") is retry


def test_a_value_hidden_in_the_noise_is_tried_beside_the_best(snapshot, tmp_path) -> None:
    """EAGLE-3 is 1 % faster for one stream than the incumbent alone, within 2 % noise
    of it (one run may put it below, so it does not always beat the incumbent's mean);
    tree decoding, the knob's other value, is 20 % slower (the knob is not flat);
    graph max bs 128 is 3.6 % faster. The optimum is the two together: each seed
    measures EAGLE-3 beside 128, as a combination (its mean beat the incumbent's) or a
    neighbour of the best launch (its effect alone was within the noise), and the pick
    carries 128 (with or without EAGLE-3: 1 % apart, within the noise)."""
    rules = [{"name": "graphs", "table": {"knob": "cuda_graph_max_bs", "op": "mul",
                                          "points": {128: {"decode_tps": 1.0},
                                                     512: {"decode_tps": 0.965}}}},
             {"name": "eagle", "when": {"speculative_eagle_topk": 1},
              "mul": {"decode_tps": 1.01}},
             {"name": "tree", "when": {"speculative_eagle_topk": {"gt": 1}},
              "mul": {"decode_tps": 0.8}}]
    body = (f"knobs:\n  memory.cuda_graph_max_bs: [128, 512]\n  speculative: [off, {EAGLE},"
            f" {TREE}]\nloads: [1]\n"
            "requests: {input_len: 32, output_len: 32, prompts_per_level: 2}\n"
            "objectives: {single_stream: {}}\nbudget: {loads: 7}\n")
    phases, picks = [], []
    for seed in range(12):
        run, host = tune(snapshot, tmp_path, body, surface(rules, 0.02, seed))
        both = next(o for o in run.outcomes if len(o.choice) == 2
                    and "eagle_topk=1" in o.choice["speculative"])
        assert both.status == "measured" and both.phase in ("combination", "neighbour")
        phases.append(both.phase)
        assert host.loads <= 6  # the sweep's four and its follow-ups, at most half as many
        picks.append(run.best("single_stream").choice.get("memory.cuda_graph_max_bs"))
    assert "neighbour" in phases, phases  # the case a combination alone misses
    assert picks.count("128") >= 11, picks


def test_a_retry_takes_the_most_relieving_of_tied_values(snapshot, tmp_path) -> None:
    """Graph max bs 128 and 256 are equally fast alone; EAGLE-3 fails capturing graphs
    at 512. Under 2 % noise which of the two measured faster is the noise's choice: the
    retry pairs EAGLE-3 with 128, the one that relieves a capture OOM most (by the
    faster mean alone, about half the seeds would take 256). Seed 1 draws a noise of
    1.3 % from its runs (2 % in truth) and 256 1.9 % faster over six runs each: beyond
    that noise, so the faster one is taken there."""
    rules = [{"name": "graphs", "table": {"knob": "cuda_graph_max_bs", "op": "mul",
                                          "points": {128: {"decode_tps": 1.0},
                                                     256: {"decode_tps": 1.0},
                                                     512: {"decode_tps": 0.95}}}},
             {"name": "eagle", "when": {"speculative_algorithm": {"ne": None}},
              "mul": {"decode_tps": 1.15}},
             {"name": "draft graphs", "when": {"speculative_algorithm": {"ne": None},
                                               "cuda_graph_max_bs": {"ge": 384}},
              "fail": {"phase": "start", "builtin": "capture_oom"}}]
    body = (f"knobs:\n  memory.cuda_graph_max_bs: [128, 256, 512]\n  speculative: [off, "
            f"{EAGLE}]\nloads: [1]\n"
            "requests: {input_len: 32, output_len: 32, prompts_per_level: 2}\n"
            "objectives: {single_stream: {}}\nbudget: {loads: 7}\n")
    picks = []
    for seed in range(6):
        run, _ = tune(snapshot, tmp_path, body, surface(rules, 0.02, seed))
        retry = next(o for o in run.outcomes if o.phase == "retry")
        picks.append(retry.choice["memory.cuda_graph_max_bs"])
    assert picks.count("128") >= 5, picks


def test_a_value_worse_alone_is_tried_beside_the_best_with_spare_follow_ups(
        snapshot, tmp_path) -> None:
    """EAGLE-3's chains lose 2 % for one stream at the incumbent's decode graph size and
    gain 8 % at 128, where graph max bs 128 alone gains 3 %: neither the combinations
    (EAGLE-3 never beat the incumbent alone) nor the refinements (2 % is beyond a tie)
    pair them. The follow-up budget left over loads the best launch's neighbours, best
    alone first, and finds the corner; the loads stay within 1.5x the sweep's."""
    rules = [{"name": "graphs", "table": {"knob": "cuda_graph_max_bs", "op": "mul",
                                          "interpolate": "log2", "points": {
                                              128: {"decode_tps": 1.03},
                                              512: {"decode_tps": 1.0}}}},
             {"name": "chains", "when": {"speculative_algorithm": "EAGLE3",
                                         "cuda_graph_max_bs": {"le": 128}},
              "mul": {"decode_tps": 1.08 / 1.03}},
             {"name": "chains at a large graph", "when": {
                 "speculative_algorithm": "EAGLE3", "cuda_graph_max_bs": {"gt": 128}},
              "mul": {"decode_tps": 0.98}}]
    body = (f"knobs:\n  memory.cuda_graph_max_bs: [128, 512]\n  speculative:\n"
            f"    - {EAGLE}\nloads: [1]\n"
            "requests: {input_len: 32, output_len: 32, prompts_per_level: 2}\n"
            "objectives: {single_stream: {}}\nbudget: {loads: 10}\n")
    run, host = tune(snapshot, tmp_path, body, surface(rules))
    alone = next(o for o in run.outcomes if o.phase == "one knob" and "speculative" in o.choice)
    assert alone.single < run.incumbent.single
    top = run.best("single_stream")
    assert top.phase == "neighbour", [(o.phase, o.label) for o in run.outcomes]
    assert top.choice["memory.cuda_graph_max_bs"] == "128" and "EAGLE3" in top.label
    assert host.loads <= 1.5 * 3
