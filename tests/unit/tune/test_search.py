"""The search on a fake host: order, pruning before load, calibration, early stop, a
failed start, budget, and a rerun that measures nothing.

The fake executor answers from a small table shaped like the field notes (89.5 tok/s at
graph max bs 128, 82 at 512, EAGLE-3 54.1, EP +5.4 GiB of weights per GPU); the host is
the reference box (tests/fixtures/hostfacts) with the composed GLM-5 NVFP4 checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gpuserve.commands.tune import FileStore
from gpuserve.tune.outcome import goodput, pareto_front
from gpuserve.tune.predict import Comm
from gpuserve.tune.report import summary, table, winner_text
from gpuserve.tune.search import Measurement, run_search
from gpuserve.tune.session import prepare
from gpuserve.tune.snapshot import HostSnapshot, last_start
from gpuserve.tune.space import load_tune
from tests.checkpoints import scan_doc_once

REPO = Path(__file__).resolve().parents[3]
BOX = json.loads((REPO / "tests/fixtures/hostfacts/reference-box-kvm.json").read_text())
TP8_AFTER_WEIGHTS_GIB = 21.7  # the field notes' free memory after TP8 weights


@pytest.fixture(scope="module")
def snapshot() -> HostSnapshot:
    """The reference box with the composed GLM-5 NVFP4 checkpoint's scan (composed and
    scanned once per test process: test_noise and test_decisions use it too)."""
    scan = json.dumps(scan_doc_once("glm-5-nvfp4", shards=20))
    return HostSnapshot(host="box", sglang_version="0.5.23", lock="sglang-0.5.23@x",
                        gpus=BOX["gpus"], checkpoint=scan, host_facts=BOX, host_json=None)


class FakeHost:
    """Deterministic speeds; counts loads; ``crash`` labels fail at start."""

    def __init__(self, crash: tuple[str, ...] = ()):
        self.t, self.loads, self.calls, self.crash = 0.0, 0, [], crash

    def now(self) -> float:
        return self.t

    def measure(self, candidate, profile, levels, first, repeat=1) -> Measurement:
        assert levels, "a measurement without a load level"
        self.calls.append((candidate.label, tuple(levels)))
        self.t += 60 if first else 30
        self.loads += first
        if any(c in candidate.label for c in self.crash):
            return Measurement("failed", reason="health: unit stopped during 'capturing "
                               "CUDA graphs': CUDA out of memory",
                               diagnosis={"outcome": "oom"})
        bs = profile.memory.cuda_graph_max_bs or 256
        single = {128: 89.5, 256: 86.0, 512: 82.0}.get(bs, 80.0)
        cap = 225.0
        if profile.speculative.algorithm:
            single, cap = 54.1, 160.0
        if profile.parallel.ep > 1:
            single, cap = single * 0.94, cap * 1.2
        if profile.memory.chunked_prefill_size == 8192:
            cap *= 1.05
        if profile.memory.chunked_prefill_size == 1024:
            single = 8.0
        out = {c: {"output_throughput": min(cap, single * c / (1 + 0.1 * (c - 1))),
                   "median_ttft_ms": 300.0 + 10 * c, "p99_itl_ms": 11.0 + c}
               for c in levels}
        m = Measurement("ok", levels=out, load_s=42.0,
                        runs={c: [figures] * repeat for c, figures in out.items()})
        if first and candidate.phase == "incumbent":
            m.after_weights_gib = TP8_AFTER_WEIGHTS_GIB
        return m


class DictStore(dict):
    def get(self, name):  # type: ignore[override]
        return dict.get(self, name)

    def put(self, outcome) -> None:
        self[outcome.candidate] = outcome


def tuned(snapshot, tmp_path, body: str, host: FakeHost, store=None):
    path = tmp_path / "t.tune.yaml"
    path.write_text(f"incumbent: {REPO / 'profiles/glm5-nvfp4-tp8.yaml'}\n{body}")
    spec, raw = load_tune(path)
    lines: list[str] = []
    prepared = prepare(spec, raw, snapshot, comm=Comm(105.6, 9.59), log=lines.append,
                       stamp=lambda: "2026-12-04T00:00:00Z")
    run = run_search(spec, prepared.knobs, prepared.ctx, host,
                     store if store is not None else DictStore())
    return run, lines, prepared


SPACE = """knobs:
  memory.cuda_graph_max_bs: [128, 256, 512]
  layout:
    - {parallel.ep: 1}
    - {parallel.ep: 8, moe.a2a_backend: flashinfer, memory.mem_fraction_static: 0.78}
    - {parallel.ep: 8, moe.a2a_backend: flashinfer, memory.mem_fraction_static: 0.83}
  speculative:
    - off
    - {speculative.algorithm: EAGLE3, speculative.draft_model: /models/d,
       speculative.num_steps: 3, speculative.eagle_topk: 1, speculative.num_draft_tokens: 4,
       memory.max_running_requests: 48}
loads: [1, 16, 64]
objectives:
  single_stream: {}
  goodput: {slo: {p99_itl: 60 ms}}
  pareto: {}
budget: {loads: 10}
"""


def test_field_notes_shape(snapshot, tmp_path) -> None:
    host = FakeHost()
    run, lines, _ = tuned(snapshot, tmp_path, SPACE, host)
    by = {o.label: o for o in run.outcomes}
    # incumbent first, then calibration from its start
    # never stopped: every level in one call, three runs each in the same server (the
    # host's noise: none on this fake host)
    assert host.calls[0] == ("incumbent", (1, 16, 64)) and host.calls[1][0] != "incumbent"
    assert run.outcomes[0].numbers["runs"] == {"1": [89.5] * 3, "16": [225.0] * 3,
                                               "64": [225.0] * 3}
    assert run.noise is not None and run.noise.rel_sd == 0
    assert any("memory calibration" in line and "offset -16.25 GiB" in line for line in lines)
    # EP at 0.78 pruned before loading with its numbers; EP at 0.83 fits and is measured
    ep78 = next(o for o in run.outcomes if "mfs=0.78" in o.label)
    assert ep78.status == "pruned" and "Not enough memory" in ep78.reason
    assert ep78.numbers["calibrated_rest_gib"] < 0 < ep78.numbers["rest_gib"]
    assert not any("mfs=0.78" in label for label, _ in host.calls)
    ep83 = next(o for o in run.outcomes if "mfs=0.83" in o.label)
    assert ep83.status == "measured" and ep83.numbers["calibrated_rest_gib"] > 0
    # EAGLE-3 is slower alone (54.1) but throughput objectives need its sweep: 16 x 54.1
    # could still beat the incumbent's 225 at concurrency 16
    eagle = next(o for o in run.outcomes if o.label.startswith("speculative="))
    assert eagle.status == "measured" and set(eagle.levels) == {1, 16, 64}
    # graph max bs 128 (the incumbent's) wins single stream; predictions are beside
    assert run.best("single_stream").label == "incumbent"
    assert by["memory.cuda_graph_max_bs=512"].single == 82.0
    assert all(o.prediction and o.prediction["single_tok_s"] > 0 for o in run.outcomes
               if o.status in ("measured", "stopped"))
    # progress lines: candidate i of n, phase, elapsed, best so far
    assert any(line.startswith("tune: candidate 2/") and "elapsed; best single_stream 89.5"
               in line for line in lines)
    text = "\n".join(table(run) + summary(run))
    assert "pruned" in text and "stopped" in text and "loads used" in text


def test_a_failed_start_is_a_result_and_the_search_goes_on(snapshot, tmp_path) -> None:
    host = FakeHost(crash=("=512",))
    run, _, _ = tuned(snapshot, tmp_path, SPACE, host)
    failed = next(o for o in run.outcomes if o.label == "memory.cuda_graph_max_bs=512")
    assert failed.status == "failed" and "CUDA out of memory" in failed.reason
    assert failed.diagnosis == {"outcome": "oom"}
    assert run.tally.failed == 1 and run.tally.measured >= 3  # carried on


def test_combinations_of_the_best_values(snapshot, tmp_path) -> None:
    """Two knobs each beat the incumbent on goodput alone (EP: batch cap x1.2; chunk
    8192: x1.05): their combination is measured next and wins."""
    body = SPACE.replace("objectives:\n  single_stream: {}\n", "objectives:\n").replace(
        "p99_itl: 60 ms", "p99_itl: 80 ms").replace(
        "loads: [1, 16, 64]", "  memory.chunked_prefill_size: [4096, 8192]\nloads: [1, 16, 64]")
    run, _, prepared = tuned(snapshot, tmp_path, body, FakeHost())
    combos = [o for o in run.outcomes if o.phase == "combination"]
    assert [sorted(o.choice) for o in combos] == [["layout", "memory.chunked_prefill_size"]]
    assert combos[0].choice["memory.chunked_prefill_size"] == "8192"
    assert "mfs=0.83" in combos[0].choice["layout"]
    assert run.best("goodput") is combos[0]
    # its winner profile says so on one line, however long (PyYAML folds at a space past
    # its 80 columns: a longer tune name puts the label's space there)
    run.spec = dataclasses.replace(run.spec, name="a-tune-named-at-length")
    text = winner_text(run, combos[0], "goodput", snapshot, tmp_path, prepared.knobs)
    description = f"a-tune-named-at-length: best goodput ({combos[0].label})"
    assert len(description) > 80
    assert any(line.startswith("description: ") and description in line
               for line in text.splitlines()), text


def test_budget_in_loads(snapshot, tmp_path) -> None:
    host = FakeHost()
    run, lines, _ = tuned(snapshot, tmp_path, SPACE.replace("{loads: 10}", "{loads: 2}"), host)
    assert host.loads == 2 and run.tally.loads == 2
    assert "budget of 2 loads spent" in run.tally.budget_hit


def test_rerun_measures_nothing(snapshot, tmp_path) -> None:
    store = FileStore(tmp_path / "store", "t")
    first = FakeHost()
    run1, _, _ = tuned(snapshot, tmp_path, SPACE, first, store)
    again = FakeHost()
    run2, lines, _ = tuned(snapshot, tmp_path, SPACE, again, store)
    assert first.calls and again.calls == []
    assert run2.tally.reused == len(run1.outcomes) and run2.tally.loads == 0
    assert sorted((o.candidate, o.status) for o in run2.outcomes) == \
        sorted((o.candidate, o.status) for o in run1.outcomes)
    assert run2.best("single_stream").candidate == run1.best("single_stream").candidate


def test_winner_profile_loads_as_a_profile(snapshot, tmp_path) -> None:
    from gpuserve.launch.profiles import load_profile

    run, _, prepared = tuned(snapshot, tmp_path, SPACE, FakeHost())
    ep = next(o for o in run.outcomes if "mfs=0.83" in o.label)
    path = tmp_path / "out" / "t-goodput.yaml"
    path.parent.mkdir()
    path.write_text(winner_text(run, ep, "goodput", snapshot, path.parent, prepared.knobs))
    text = path.read_text()
    assert "# host box, SGLang 0.5.23, lock sglang-0.5.23@x" in text
    profile = load_profile(path)
    assert profile.parallel.ep == 8 and profile.memory.mem_fraction_static == 0.83


def test_goodput_and_pareto() -> None:
    from gpuserve.tune.outcome import Outcome

    a = Outcome("a", "one knob", {}, "measured", gpus=8, levels={
        1: {"output_throughput": 90.0, "p99_itl_ms": 12.0},
        64: {"output_throughput": 225.0, "p99_itl_ms": 300.0}})
    b = Outcome("b", "one knob", {}, "measured", gpus=8, levels={
        1: {"output_throughput": 80.0, "p99_itl_ms": 13.0},
        16: {"output_throughput": 200.0, "p99_itl_ms": 50.0}})
    assert goodput(a, {"p99_itl_ms": 100.0}) == (90.0, 1)
    assert goodput(b, {"p99_itl_ms": 100.0}) == (200.0, 16)
    front = pareto_front([a, b])
    assert [(p[3], p[2]) for p in front] == [("a", 1), ("b", 16), ("a", 64)]


def test_load_time_from_the_journal() -> None:
    journal = (
        "2026-12-04T10:00:00.000000+00:00 lab-gpu systemd[1]: Started "
        "gpuserve-sglang.service - SGLang.\n"
        "2026-12-04T10:00:05.000000+00:00 lab-gpu python[9]: [2026-12-04 10:00:05] Load "
        "weight end. elapsed=3.00 s, avail mem=21.70 GB, mem usage=72.30 GB.\n"
        "2026-12-04T10:00:41.500000+00:00 lab-gpu python[9]: [2026-12-04 10:00:41] The "
        "server is fired up and ready to roll!\n")
    timing = last_start(journal)
    assert timing is not None and timing.load_s == pytest.approx(41.5)
    assert "Load weight end" in timing.log
    assert last_start(journal.replace("fired up", "still loading")) is None


def test_custom_all_reduce_without_measured_p2p_is_pruned(snapshot, tmp_path) -> None:
    """A host whose host.json leaves SGLang's custom all-reduce on (host data turned the
    P2P verdict off: nccl_env NCCL_P2P_DISABLE "") but whose P2P was not measured
    working: a candidate is refused from the host's gates, never loaded. Where the
    host's own choice turns it off (the reference box's host.json, or without one what
    the host deploy writes from its facts) the same candidate loads."""
    body = ("knobs:\n  memory.cuda_graph_max_bs: [128, 256]\n"
            "loads: [1, 8]\nobjectives: {single_stream: {}}\n")
    left_on = dataclasses.replace(snapshot, host_json=json.dumps(
        {"p2p": "none", "disable_custom_all_reduce": False}))
    host = FakeHost()
    run, _, _ = tuned(left_on, tmp_path, body, host)
    pruned = [o for o in run.outcomes if o.status == "pruned"]
    assert [o.label for o in pruned] == ["memory.cuda_graph_max_bs=256"]
    assert "P2P was not measured working" in pruned[0].reason
    assert [label for label, _ in host.calls] == ["incumbent"]
    for host_json in (json.dumps({"p2p": "none", "disable_custom_all_reduce": True}), None):
        host = FakeHost()
        where = tmp_path / str(bool(host_json))
        where.mkdir()
        run, _, _ = tuned(dataclasses.replace(snapshot, host_json=host_json), where, body,
                          host)
        assert [o for o in run.outcomes if o.status == "pruned"] == []
        assert "memory.cuda_graph_max_bs=256" in [label for label, _ in host.calls]


def test_auto_values_from_the_model_and_the_host(snapshot, tmp_path) -> None:
    body = ("knobs:\n  layout: auto\n  memory.cuda_graph_max_bs: auto\n"
            "loads: [1]\nobjectives: {single_stream: {}}\nbudget: {loads: 1}\n")
    _, _, prepared = tuned(snapshot, tmp_path, body, FakeHost())
    knobs = {k.name: k for k in prepared.knobs}
    layouts = [v.fields for v in knobs["layout"].values]
    # 8 GPUs; GLM-5: 256 routed experts (EP 4 and 8 divide them), 64 heads (attention DP 8)
    assert {(f["parallel.ep"], f["parallel.attention_dp"]) for f in layouts} == {
        (1, 1), (4, 1), (8, 1), (1, 8)}
    sizes = [int(v.label) for v in knobs["memory.cuda_graph_max_bs"].values]
    assert 128 in sizes and len(sizes) >= 3 and sizes == sorted(sizes)


def test_ctrl_c_stops_between_steps_and_keeps_what_was_measured(snapshot, tmp_path) -> None:
    class Interrupted(FakeHost):
        def measure(self, candidate, profile, levels, first, repeat=1):
            if len(self.calls) >= 3:
                raise KeyboardInterrupt
            return super().measure(candidate, profile, levels, first, repeat)

    store = DictStore()
    run, lines, _ = tuned(snapshot, tmp_path, SPACE, Interrupted(), store)
    assert run.tally.interrupted
    assert any("interrupted" in line for line in lines)
    assert run.outcomes[0].label == "incumbent" and run.outcomes[0].candidate in store


def test_early_stop_single_stream_only(snapshot, tmp_path) -> None:
    """With single stream the only objective, 54.1 < 0.75 x 89.5 stops EAGLE-3 after
    concurrency 1: one call, no sweep."""
    body = SPACE.replace("  goodput: {slo: {p99_itl: 60 ms}}\n  pareto: {}\n", "")
    host = FakeHost()
    run, _, _ = tuned(snapshot, tmp_path, body, host)
    eagle = next(o for o in run.outcomes if o.label.startswith("speculative="))
    assert eagle.status == "stopped" and set(eagle.levels) == {1}
    assert sum(1 for label, _ in host.calls if label == eagle.label) == 1


def test_early_stop_when_dominated_at_every_load(snapshot, tmp_path) -> None:
    """With throughput objectives a candidate stops only when its ceiling (c x its single
    stream) is below a measured candidate's throughput at every load level."""
    body = ("knobs:\n  memory.chunked_prefill_size: [1024, 4096]\nloads: [1, 8]\n"
            "objectives: {single_stream: {}, pareto: {}}\n")
    run, _, _ = tuned(snapshot, tmp_path, body, FakeHost())
    dp = next(o for o in run.outcomes if o.label == "memory.chunked_prefill_size=1024")
    assert dp.status == "stopped" and "every load" in dp.reason, dp.reason


def test_roofline_uses_the_measured_read_bandwidth_where_gpus_yaml_has_one():
    from gpuserve.tune.predict import bandwidth_gbs

    # H200: measured 4237 GB/s (bench/results/h200-roofline-2026-12-04.json), not the
    # datasheet's 4800; a card without a measurement keeps its datasheet figure
    assert bandwidth_gbs("NVIDIA H200") == 4237.0
    assert bandwidth_gbs("NVIDIA H100 80GB HBM3") == 3350.0


def test_room_inside_the_calibrations_error_loads_last(snapshot, tmp_path) -> None:
    """The pre-load check counts what a draft model adds (SGLang's own reserve for it)
    and the calibration's error: a candidate whose calibrated room lies inside that
    loads after every candidate that surely fits, whatever its prediction."""
    from gpuserve.memory.calibration import CALIBRATION_ERROR_GIB, DRAFT_DEFAULT_GIB
    from gpuserve.tune.judge import Verdict, risky

    host = FakeHost()
    run, lines, _ = tuned(snapshot, tmp_path, SPACE, host)
    singles = [o for o in run.outcomes if o.phase == "one knob" and o.status != "pruned"]
    eagle = next(o for o in singles if o.label.startswith("speculative="))
    assert eagle.numbers["uncertainty_gib"] == CALIBRATION_ERROR_GIB + DRAFT_DEFAULT_GIB
    graph = next(o for o in singles if o.label == "memory.cuda_graph_max_bs=256")
    assert graph.numbers["uncertainty_gib"] == CALIBRATION_ERROR_GIB
    order = [label for label, _ in host.calls]
    flags = {o.label: risky(Verdict(numbers=o.numbers)) for o in singles}
    assert any(flags.values()) and not all(flags.values()), flags
    firsts = {o.label: order.index(o.label) for o in singles}
    assert max(firsts[k] for k, v in flags.items() if not v) < \
        min(firsts[k] for k, v in flags.items() if v), (flags, order)
    assert any("inside its uncertainty" in line for line in lines)



def test_repeated_runs_are_scenarios_of_one_deploy(tmp_path) -> None:
    """Repeats are benchmark runs in the loaded server: one deploy whose bench section
    holds each level's scenario again (single-r2, c8-r3), read back by level."""
    from gpuserve.tune.candidates import bench_section, scenario_level

    path = tmp_path / "t.tune.yaml"
    path.write_text(f"incumbent: {REPO / 'profiles/glm5-nvfp4-tp8.yaml'}\n"
                    "knobs:\n  memory.cuda_graph_max_bs: [128]\nloads: [1, 8]\n")
    spec, _ = load_tune(path)
    names = list(bench_section(spec, (1, 8), 3)["scenarios"])
    assert names == ["single", "single-r2", "single-r3", "c8", "c8-r2", "c8-r3"]
    assert [scenario_level(n) for n in names] == [1, 1, 1, 8, 8, 8]
    assert scenario_level("batch") is None and scenario_level("c8-rx") is None


# ------------------------------------------------------------ the failed start's journal

def _run(stamp: str, *body: str) -> list[str]:
    return [f"{stamp} lab-gpu systemd[1]: Started gpuserve-sglang.service - SGLang.",
            *(f"{stamp} lab-gpu python[7]: {line}" for line in body)]


# composed, in the ``short-iso-precise`` shape the snapshot deploy reads (journalctl -o
# short-iso-precise): a candidate that crashed while serving, systemd's Restart=on-failure
# start of it, then the rollback's start of the last good profile
CRASH = "RuntimeError: CUDA error: an illegal memory access was encountered"
JOURNAL = "\n".join([
    *_run("2026-12-06T10:00:00.000000+0000", "The server is fired up and ready to roll!"),
    *_run("2026-12-06T10:05:00.000000+0000", "The server is fired up and ready to roll!",
          CRASH),
    *_run("2026-12-06T10:05:30.000000+0000", "Load weight begin."),
    *_run("2026-12-06T10:06:00.000000+0000", "The server is fired up and ready to roll!")])


def test_the_failed_start_is_found_behind_the_restarts_that_followed_it() -> None:
    from gpuserve.tune.snapshot import error_line, failed_run, last_run

    assert error_line(last_run(JOURNAL)) is None  # the rollback's start is the last one
    run = failed_run(JOURNAL)
    assert error_line(run) == CRASH and run.startswith("2026-12-06T10:05:00")
    # bounded: a crash further back than ``within`` starts is not this candidate's
    assert error_line(failed_run(JOURNAL, within=2)) is None
    assert failed_run("no start here") == "no start here"
