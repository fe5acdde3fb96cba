"""lab/surface.py: the surface loader (bad files give errors naming file and field), its
YAML subset (read like PyYAML), the evaluation of launches and the true optimum, on the
shipped surfaces (lab/surfaces/) and on small surfaces written here."""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path

import pytest
import yaml

from lab import sglang_standin, surface

REPO = Path(__file__).resolve().parents[3]
SURFACES = REPO / "lab" / "surfaces"
FIELD_NOTES = SURFACES / "field-notes.yaml"
H200 = SURFACES / "h200-nvlink.yaml"
SPACE = SURFACES / "spaces" / "reference.yaml"
BASE = {"tp_size": 8, "kv_cache_dtype": "fp8_e4m3", "mem_fraction_static": 0.9}
MINIMAL = "format: 1\nname: t\ndescription: a test surface\nbase: {decode_tps: 50}\n"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


def _bench_space() -> tuple[list[dict], list[int]]:
    spec = importlib.util.spec_from_file_location("surface_optimum",
                                                  REPO / "bench" / "surface_optimum.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    space, levels, _ = mod.launches(SPACE)
    return space, levels


# -- YAML subset ------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(SURFACES.glob("*.yaml")) + [SPACE],
                         ids=lambda p: p.name)
def test_shipped_files_read_like_pyyaml(path):
    assert surface.parse_yaml(path.read_text()) == yaml.safe_load(path.read_text())


def test_yaml_subset_scalars_and_nesting_like_pyyaml():
    text = ("a: 'it''s # not a comment'  # a comment\n"
            "b: \"x: y\"\n"
            "c: [1, 2.5, -3, 1e5, 1.0e+5, yes, Off, ~, null, \"q\"]\n"
            "d: {k: [a, b], 'n': {m: 0.78}}\n"
            "e:\n  - one\n  - k: v\n    j: 2\n  -\n    - nested\n"
            "f:\n- same-indent\n"
            "128: {decode_tps: 1.0}\n"
            "g:\n")
    assert surface.parse_yaml(text) == yaml.safe_load(text)


@pytest.mark.parametrize("text,where", [
    ("a: 1\n  b: 2\n", "line 2"),           # indentation under a scalar
    ("a: 1\na: 2\n", "line 2"),             # duplicate key
    ("a: {b: 1\n", "line 1"),               # flow mapping not closed on its line
    ("a: |\n  text\n", "line 1"),           # block scalar
    ("- a\nb: 1\n", "line 2"),              # a mapping after a top-level list
])
def test_yaml_subset_errors_name_the_line(tmp_path, text, where):
    with pytest.raises(surface.SurfaceError) as e:
        surface.load(_write(tmp_path, text))
    assert str(e.value).startswith(f"{tmp_path / 's.yaml'}: {where}")


# -- loader -------------------------------------------------------------------------------


@pytest.mark.parametrize("text,field,words", [
    (MINIMAL + "speed: 3\n", "speed", "unknown key"),
    (MINIMAL.replace("format: 1", "format: 2"), "format", "must be 1"),
    (MINIMAL.replace("name: t\n", ""), "name", "required"),
    ("format: 1\nname: t\ndescription: d\nbase: {prefill_tps: 5}\n", "base.decode_tps",
     "required"),
    (MINIMAL.replace("decode_tps: 50", "decode_tps: fast"), "base.decode_tps",
     "must be a number"),
    (MINIMAL.replace("decode_tps: 50", "decode_tps: 50, speed: 1"), "base.speed",
     "unknown key"),
    (MINIMAL + "hardware: {gpus: 8}\n", "hardware.gpus", "unknown key"),
    (MINIMAL + "box: h100-pcie\n", "box", "no lab box 'h100-pcie'"),
    (MINIMAL + "box: [a]\n", "box", "must be a lab box name"),
    (MINIMAL + "model: {layers: 8}\n", "model.layers", "unknown key"),
    (MINIMAL + "rules: {a: 1}\n", "rules", "must be a list"),
    (MINIMAL + "rules:\n  - when: {tp_size: 8}\n", "rules[0]", "has no effect"),
    (MINIMAL + "rules:\n  - when: {tp: 8}\n    mul: {decode_tps: 2}\n", "rules[0].when.tp",
     "not a launch setting"),
    (MINIMAL + "rules:\n  - when: {tp_size: {above: 4}}\n    mul: {decode_tps: 2}\n",
     "rules[0].when.tp_size.above", "unknown matcher"),
    (MINIMAL + "rules:\n  - when: {tp_size: {in: 8}}\n    mul: {decode_tps: 2}\n",
     "rules[0].when.tp_size.in", "must be a list"),
    (MINIMAL + "rules:\n  - mul: {decode_tps: -1}\n", "rules[0].mul.decode_tps", ">= 0"),
    (MINIMAL + "rules:\n  - boost: {decode_tps: 2}\n", "rules[0].boost", "unknown key"),
    (MINIMAL + "rules:\n  - table: {knob: tp_size}\n", "rules[0].table.points", "missing"),
    (MINIMAL + "rules:\n  - table: {knob: tp_size, op: pow, points: {8: {decode_tps: 2}}}\n",
     "rules[0].table.op", "mul, add or set"),
    (MINIMAL + "rules:\n  - table: {knob: moe_runner_backend, interpolate: log2, "
     "points: {triton: {decode_tps: 2}}}\n", "rules[0].table.points.triton", "numeric"),
    (MINIMAL + "rules:\n  - table: {knob: tp_size, points: {8: {speed: 2}}}\n",
     "rules[0].table.points.8.speed", "unknown key"),
    (MINIMAL + "rules:\n  - fail: {phase: start}\n", "rules[0].fail.message", "needed"),
    (MINIMAL + "rules:\n  - fail: {phase: boot, message: x}\n", "rules[0].fail.phase",
     "start or serve"),
    (MINIMAL + "rules:\n  - fail: {phase: start, message: x, after_requests: 2}\n",
     "rules[0].fail.after_requests", "only with phase: serve"),
    (MINIMAL + "rules:\n  - fail: {phase: serve, builtin: capture_oom}\n",
     "rules[0].fail.builtin", "at start only"),
    (MINIMAL + "rules:\n  - fail: {phase: start, message: x, frame: nowhere}\n",
     "rules[0].fail.frame", "path:line:function"),
])
def test_bad_surface_files_name_file_and_field(tmp_path, text, field, words):
    path = _write(tmp_path, text)
    with pytest.raises(surface.SurfaceError) as e:
        surface.load(path)
    assert str(e.value).startswith(f"{path}: {field}: "), str(e.value)
    assert words in str(e.value)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(surface.SurfaceError, match=r"nope\.yaml: cannot read"):
        surface.load(tmp_path / "nope.yaml")


def test_rules_driving_a_metric_negative_name_the_metric(tmp_path):
    s = surface.load(_write(tmp_path, MINIMAL + "rules:\n  - when: {ep_size: 8}\n"
                            "    add: {decode_tps: -60}\n"))
    assert s.evaluate({"ep_size": 1}, 1).per_stream_tps == pytest.approx(50)
    with pytest.raises(surface.SurfaceError, match=r"s\.yaml: decode_tps: rules give -10"):
        s.evaluate({"ep_size": 8}, 1)


def test_unknown_launch_key_is_refused():
    with pytest.raises(surface.SurfaceError, match=r"launch\.graph_bs: not a launch setting"):
        surface.load(FIELD_NOTES).evaluate({"graph_bs": 128}, 1)


# -- evaluation: the field-note figures ---------------------------------------------------


@pytest.fixture(scope="module")
def fn() -> surface.Surface:
    return surface.load(FIELD_NOTES)


def test_graph_max_bs_512_vs_128_single_stream(fn):
    assert fn.evaluate({**BASE, "cuda_graph_max_bs": 512}, 1).per_stream_tps == \
        pytest.approx(82.0, abs=0.05)
    assert fn.evaluate({**BASE, "cuda_graph_max_bs": 128}, 1).per_stream_tps == \
        pytest.approx(89.5)
    # SGLang's default on 96 GB cards at TP8 is 512, under either name
    unset = fn.evaluate(BASE, 1)
    assert unset.launch["cuda_graph_max_bs_decode"] == 512
    assert unset.per_stream_tps == pytest.approx(82.0, abs=0.05)
    assert fn.evaluate({**BASE, "cuda_graph_max_bs_decode": 128}, 1).per_stream_tps == \
        pytest.approx(89.5)
    # log2 interpolation: 181 sits between 128 (1.0) and 256 (0.961)
    mid = fn.evaluate({**BASE, "cuda_graph_max_bs": 181}, 1).per_stream_tps
    assert 86.0 < mid < 89.5


def test_eagle3_is_slower_than_no_speculation(fn):
    ev = fn.evaluate({**BASE, "cuda_graph_max_bs": 128, "speculative_algorithm": "EAGLE3"}, 1)
    assert ev.ok and ev.per_stream_tps == pytest.approx(54.1)
    assert ev.launch["speculative_num_steps"] == 3  # SGLang's auto (3, 1, 4)
    assert ev.memory["max_running_requests"] == 48


def test_ep8_memory_arithmetic(fn):
    at078 = fn.evaluate({**BASE, "ep_size": 8, "mem_fraction_static": 0.78}, 1)
    assert at078.failed == "start"
    assert at078.memory["kv_rest_gb"] == pytest.approx(-4.4, abs=0.05)
    assert at078.error.startswith("ValueError: Loaded weights leave no GPU memory for the KV "
                                  "cache under --mem-fraction-static=0.78. Raise "
                                  "--mem-fraction-static above 0.827")
    at083 = fn.evaluate({**BASE, "ep_size": 8, "mem_fraction_static": 0.83}, 1)
    assert at083.ok and 0 < at083.memory["kv_rest_gb"] < 1
    tp8 = fn.evaluate(BASE, 1)
    assert tp8.memory["free_after_weights_gb"] == pytest.approx(21.7, abs=0.05)
    assert at083.memory["free_after_weights_gb"] == pytest.approx(16.3, abs=0.05)
    # the flashinfer all-to-all forces EP = TP
    a2a = fn.evaluate({**BASE, "moe_a2a_backend": "flashinfer", "mem_fraction_static": 0.78}, 1)
    assert a2a.launch["ep_size"] == 8 and a2a.failed == "start"


def test_start_failures_and_the_crash(fn):
    capture = fn.evaluate({**BASE, "cuda_graph_max_bs": 512, "mem_fraction_static": 0.94}, 1)
    assert capture.failed == "start"
    assert capture.error.startswith("Exception: Capture cuda graph failed: CUDA out of memory")
    assert fn.evaluate({**BASE, "cuda_graph_max_bs": 128, "mem_fraction_static": 0.94}, 1).ok
    tp4 = fn.evaluate({**BASE, "tp_size": 4}, 1)
    assert tp4.failed == "start" and tp4.error.startswith("torch.OutOfMemoryError: CUDA out")
    dsa = fn.evaluate({**BASE, "dsa_decode_backend": "flashmla_kv"}, 1)
    assert dsa.failed == "start" and dsa.error.endswith("Unsupported architecture")
    tree = fn.evaluate({**BASE, "speculative_algorithm": "EAGLE3", "speculative_num_steps": 3,
                        "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8}, 1)
    assert tree.failed == "serve" and tree.crash_after_requests == 2
    assert tree.error.startswith("RuntimeError: CUDA error: an illegal memory access")


def test_rate_per_stream_against_concurrency(fn):
    launch = {**BASE, "cuda_graph_max_bs": 128}
    evs = {c: fn.evaluate(launch, c) for c in (1, 2, 4, 16, 64)}
    per = [evs[c].per_stream_tps for c in (1, 2, 4, 16, 64)]
    assert per == sorted(per, reverse=True)          # each stream gets slower
    assert evs[2].total_tps > evs[1].total_tps        # until the batch cap...
    assert evs[64].total_tps == pytest.approx(225)    # ...the field notes' ~225
    # above the graphs' max bs SGLang decodes eagerly: the cap falls by eager_factor
    small = fn.evaluate({**BASE, "cuda_graph_max_bs": 8}, 16)
    assert small.total_tps == pytest.approx(225 * 0.45)
    # max_running_requests caps the batch
    capped = fn.evaluate({**launch, "max_running_requests": 2}, 16)
    assert capped.running == 2 and capped.total_tps == pytest.approx(evs[2].total_tps)


def test_ttft_and_output_throughput(fn):
    one = fn.evaluate({**BASE, "cuda_graph_max_bs": 128}, 1, input_len=1000, output_len=101)
    assert one.ttft_s == pytest.approx(0.05 + 1000 / 4000)
    assert one.output_tps == pytest.approx(101 / (one.ttft_s + 100 / 89.5))
    small_chunks = fn.evaluate({**BASE, "chunked_prefill_size": 2048}, 1, input_len=1000)
    assert small_chunks.ttft_s == pytest.approx(0.05 + 1000 / (4000 * 0.7))


def test_speedup_scales_time_not_order(fn):
    a = fn.evaluate({**BASE, "cuda_graph_max_bs": 128}, 1, speedup=4)
    b = fn.evaluate({**BASE, "cuda_graph_max_bs": 512}, 1, speedup=4)
    assert a.per_stream_tps == pytest.approx(4 * 89.5)
    assert a.per_stream_tps / b.per_stream_tps == pytest.approx(89.5 / 82.0, abs=1e-3)


# -- the optimum --------------------------------------------------------------------------


def test_true_optimum_of_the_shipped_surfaces():
    space, levels = _bench_space()
    fn, h200 = surface.load(FIELD_NOTES), surface.load(H200)

    best = surface.true_optimum(fn, space, "single_stream")
    assert best.value == pytest.approx(89.5)
    assert best.launch["cuda_graph_max_bs"] == 128 and "speculative_algorithm" not in best.launch
    assert "ep_size" not in best.launch
    assert all(launch.get("cuda_graph_max_bs") == 128 for launch in best.near)
    runner_up = next(r for r in best.ranking if r[0] < best.value * 0.98)
    assert runner_up[0] < 0.97 * best.value  # a clear optimum, not a tie
    assert any(ev.failed == "serve" for _, ev in best.failed)  # the crash is in the space

    thr = surface.true_optimum(fn, space, "throughput", concurrencies=tuple(levels))
    assert thr.launch["ep_size"] == 8 and thr.value == pytest.approx(270)
    assert all(launch.get("ep_size") == 8 for launch in thr.near)

    single = surface.true_optimum(h200, space, "single_stream")
    assert single.launch["speculative_algorithm"] == "EAGLE3"
    assert single.launch["speculative_num_steps"] == 4
    assert single.launch["speculative_eagle_topk"] == 1
    assert all(launch.get("speculative_num_steps") == 4 for launch in single.near)
    nxt = next(r for r in single.ranking if r[0] < single.value * 0.98)
    assert nxt[0] < 0.95 * single.value

    thr = surface.true_optimum(h200, space, "throughput", concurrencies=tuple(levels))
    assert thr.launch.get("enable_dp_attention") and "speculative_algorithm" not in thr.launch
    assert all(launch.get("enable_dp_attention") for launch in thr.near)
    nxt = next(r for r in thr.ranking if r[0] < thr.value * 0.98)
    assert nxt[0] < 0.9 * thr.value


def test_true_optimum_skips_failures_and_checks_its_arguments(fn):
    launches = [{**BASE, "ep_size": 8, "mem_fraction_static": 0.78}, BASE]
    best = surface.true_optimum(fn, launches, "single_stream")
    assert best.launch is BASE and len(best.failed) == 1
    with pytest.raises(ValueError, match="objective"):
        surface.true_optimum(fn, launches, "latency")
    none = surface.true_optimum(fn, launches[:1], "throughput")
    assert none.launch is None and none.value == 0.0


def test_matchers(tmp_path):
    s = surface.load(_write(tmp_path, MINIMAL + """rules:
  - when: {speculative_algorithm: null}
    mul: {decode_tps: 2}
  - when: {tp_size: {ge: 4, lt: 8}}
    mul: {decode_tps: 3}
  - when: {moe_runner_backend: [triton, cutlass]}
    add: {decode_tps: 1}
  - when: {enable_dp_attention: false}
    add: {ttft_s: 1}
"""))
    assert s.evaluate({}, 1).per_stream_tps == pytest.approx(100)
    assert s.evaluate({"speculative_algorithm": "EAGLE3"}, 1).per_stream_tps == \
        pytest.approx(50)
    assert s.evaluate({"tp_size": 4}, 1).per_stream_tps == pytest.approx(300)
    assert s.evaluate({"tp_size": 8}, 1).per_stream_tps == pytest.approx(100)
    assert s.evaluate({"moe_runner_backend": "triton"}, 1).per_stream_tps == \
        pytest.approx(101)
    assert s.evaluate({}, 1, input_len=0).ttft_s == pytest.approx(1)
    assert s.evaluate({"enable_dp_attention": True, "dp_size": 2}, 1,
                      input_len=0).ttft_s == pytest.approx(0)


# -- one implementation -------------------------------------------------------------------


def test_wheel_carries_this_module_and_the_surfaces(tmp_path):
    sglang_standin.publish(tmp_path)
    with zipfile.ZipFile(tmp_path / "wheels" / sglang_standin.wheel_name("0.5.23+lab")) as zf:
        assert zf.read("sglang/_standin/surface.py") == (REPO / "lab" / "surface.py"
                                                         ).read_bytes()
        for path in SURFACES.glob("*.yaml"):
            assert zf.read(f"sglang/_standin/surfaces/{path.name}") == path.read_bytes()


# -- noise --------------------------------------------------------------------------------


def _with_noise(noise):
    data = surface.parse_yaml((SURFACES / "field-notes.yaml").read_text())
    data["noise"] = noise
    return surface.from_data(data, "noisy.yaml")


def test_noise_is_seeded_per_run_and_start():
    s = _with_noise({"run": 0.02, "start": 0.01, "seed": 7})
    assert s.noise == {"run": 0.02, "start": 0.01, "seed": 7}
    draws = [surface.noise_factor(0.02, 7, "run", str(i)) for i in range(400)]
    assert draws == [surface.noise_factor(0.02, 7, "run", str(i)) for i in range(400)]
    assert draws != [surface.noise_factor(0.02, 8, "run", str(i)) for i in range(400)]
    mean = sum(draws) / len(draws)
    sd = (sum((d - mean) ** 2 for d in draws) / (len(draws) - 1)) ** 0.5
    assert abs(mean - 1) < 0.004 and 0.016 < sd < 0.024
    assert all(0.94 <= d <= 1.06 for d in draws)  # cut at three sd
    assert surface.noise_factor(0.0, 7, "run", "1") == 1.0
    # a start's factor scales the whole start; each run of it draws its own
    a = s.start(surface.LaunchArgs({}), surface._shape(surface._sim(), s.model), 1.0, "x")
    b = s.start(surface.LaunchArgs({}), surface._shape(surface._sim(), s.model), 1.0, "y")
    assert a.perf.decode_tps != b.perf.decode_tps
    assert a.perf.run_factor(1) != a.perf.run_factor(2)


@pytest.mark.parametrize(("noise", "field"), [
    ({"run": -0.1}, "noise.run"), ({"run": 0.5}, "noise.run"), ({"start": "x"}, "noise.start"),
    ({"seed": 1.5}, "noise.seed"), ({"burst": 0.1}, "noise.burst")])
def test_bad_noise_names_its_field(noise, field):
    with pytest.raises(surface.SurfaceError) as info:
        _with_noise(noise)
    assert info.value.field == field
