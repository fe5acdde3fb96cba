"""Throughput-check scenarios, expectations and the gate (gpuserve/launch/bench.py),
through real profile files so every error names the file and line a user must fix."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gpuserve.errors import InputError
from gpuserve.launch.bench import (
    DEFAULT_SCENARIOS,
    BenchSpec,
    client_argv,
    judge,
    run_fingerprint,
    validate_mode,
    validate_on_regression,
)
from gpuserve.launch.profiles import load_profile


def write_profile(tmp_path: Path, bench: str, memory: str = "") -> Path:
    path = tmp_path / "p.yaml"
    path.write_text("model:\n  path: /models/x\n" + memory + "bench:\n"
                    + textwrap.indent(textwrap.dedent(bench), "  "))
    return path


def test_defaults_without_a_bench_section(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("model:\n  path: /models/x\n")
    spec = load_profile(path).bench
    assert spec.scenarios == DEFAULT_SCENARIOS
    assert [s.concurrency for s in spec.scenarios] == [1, 64]
    assert spec.expectations == () and spec.regression_tolerance_pct is None


def test_full_section(tmp_path):
    spec = load_profile(write_profile(tmp_path, """
        scenarios:
          single: {concurrency: 1, prompts: 3, input_len: 256, output_len: 64}
          batch: {concurrency: 16}
        sweep: [4, 8]
        expect:
          single: {output_throughput: ">= 80 tok/s", median_ttft_ms: "0.5 s"}
          c8: {request_throughput: 2 req/s}
        regression_tolerance: 12.5%
        on_regression: rollback
        timeout: 600
    """)).bench
    names = [s.name for s in spec.scenarios]
    assert names == ["single", "batch", "c4", "c8"]
    batch = spec.scenario("batch")
    # unset keys come from the default scenario of the same name
    assert (batch.concurrency, batch.prompts, batch.input_len, batch.output_len) == (
        16, 128, 1024, 256)
    c8 = spec.scenario("c8")
    assert (c8.prompts, c8.input_len, c8.output_len) == (16, 1024, 256)
    ttft = next(e for e in spec.expectations if e.figure == "median_ttft_ms")
    assert (ttft.op, ttft.value, ttft.unit) == ("<=", 500.0, "ms")
    assert spec.regression_tolerance_pct == 12.5
    assert spec.on_regression == "rollback" and spec.timeout_s == 600


@pytest.mark.parametrize(("bench", "field", "words"), [
    ("scenarios: {single: {concurrency: 0}}", "bench.scenarios.single.concurrency",
     "must be in 1..4096"),
    ("scenarios: {single: {prompts: -3}}", "bench.scenarios.single.prompts", "must be in"),
    ("scenarios: {b: {concurrency: 8, prompts: 4}}", "bench.scenarios.b.prompts",
     "at least concurrency"),
    ("scenarios: {single: {output_len: 1.5}}", "bench.scenarios.single.output_len",
     "must be an integer"),
    ("scenarios: {single: {concurency: 2}}", "bench.scenarios.single.concurency",
     "unknown key"),
    ("scenarios: {}", "bench.scenarios", "non-empty"),
    ("sweep: [0]", "bench.sweep[0]", "must be in 1..4096"),
    ("sweep: 8", "bench.sweep", "non-empty list"),
    ("expect: {single: {output_throughput: 80 furlongs}}",
     "bench.expect.single.output_throughput", "unknown unit 'furlongs'"),
    ("expect: {single: {output_throughput: 80}}", "bench.expect.single.output_throughput",
     "give a unit"),
    ("expect: {single: {median_ttft_ms: 80 tok/s}}", "bench.expect.single.median_ttft_ms",
     "unknown unit 'tok/s'"),
    ("expect: {single: {goodput: 80 tok/s}}", "bench.expect.single.goodput",
     "not a figure"),
    ("expect: {huge: {output_throughput: 80 tok/s}}", "bench.expect.huge", "no scenario"),
    ("expect: {single: {output_throughput: '>= -3 tok/s'}}",
     "bench.expect.single.output_throughput", "must look like"),
    ("regression_tolerance: 150%", "bench.regression_tolerance", "percentage"),
    ("regression_tolerance: lots", "bench.regression_tolerance", "percentage"),
    ("on_regression: panic", "bench.on_regression", "one of report, rollback"),
    ("timeout: .inf", "bench.timeout", "seconds"),
    ("scenario: {}", "bench.scenario", "unknown key"),
])
def test_bad_input_names_file_line_and_field(tmp_path, bench, field, words):
    path = write_profile(tmp_path, bench)
    with pytest.raises(InputError) as err:
        load_profile(path)
    assert err.value.file == str(path.resolve())
    assert err.value.field == field
    assert err.value.line is not None and err.value.line >= 4
    assert words in err.value.message


def test_concurrency_above_max_running_requests(tmp_path):
    path = write_profile(tmp_path, "scenarios: {batch: {concurrency: 64}}",
                         memory="memory:\n  max_running_requests: 32\n")
    with pytest.raises(InputError, match="exceeds the profile's memory.max_running_requests=32"):
        load_profile(path)


def test_extends_merges_scenarios_and_names_the_parent(tmp_path):
    (tmp_path / "parent.yaml").write_text(
        "model:\n  path: /models/x\nbench:\n  scenarios:\n    single: {concurrency: 1}\n"
        "    batch: {concurrency: 0}\n")
    child = tmp_path / "child.yaml"
    child.write_text("extends: parent.yaml\nbench:\n  timeout: 60\n")
    with pytest.raises(InputError) as err:
        load_profile(child)
    assert err.value.file.endswith("parent.yaml") and err.value.line == 6


def test_host_data_modes():
    assert validate_mode(None, "inv.py") == "auto"
    assert validate_mode("always", "inv.py") == "always"
    assert validate_mode(False, "inv.py") == "off"
    with pytest.raises(InputError, match="inv.py: bench: must be one of auto, always, off"):
        validate_mode("sometimes", "inv.py")
    assert validate_on_regression("rollback", "inv.py") == "rollback"
    with pytest.raises(InputError, match="on_regression"):
        validate_on_regression("revert", "inv.py")


def test_client_argv_is_fixed_length_random_ids_closed_loop():
    argv = client_argv(DEFAULT_SCENARIOS[1], port=30000, served_name="glm-5",
                       tokenizer="/models/GLM-5", output_file="/run/out.jsonl", tag="t")
    pairs = dict(zip(argv[::2], argv[1::2], strict=True))
    assert pairs["--dataset-name"] == "random-ids"
    assert pairs["--random-range-ratio"] == "1.0"
    assert pairs["--max-concurrency"] == "64" and pairs["--num-prompts"] == "128"
    assert pairs["--base-url"] == "http://127.0.0.1:30000"
    assert not any("key" in a.lower() for a in argv)


def test_fingerprint_changes_with_launch_lock_and_scenarios():
    spec = BenchSpec()
    base = run_fingerprint("sha256:a", "lock1", spec)
    assert base == run_fingerprint("sha256:a", "lock1", BenchSpec())
    assert base != run_fingerprint("sha256:b", "lock1", spec)
    assert base != run_fingerprint("sha256:a", "lock2", spec)
    assert base != run_fingerprint("sha256:a", "lock1",
                                   BenchSpec(scenarios=DEFAULT_SCENARIOS[:1]))


def test_gate_expectations_and_regression(tmp_path):
    spec = load_profile(write_profile(tmp_path, """
        expect:
          single: {output_throughput: 80 tok/s, median_ttft_ms: 500 ms}
        regression_tolerance: 10%
    """)).bench
    ok = judge(spec, "single", {"output_throughput": 89.5, "median_ttft_ms": 120.0},
               {"output_throughput": 90.0})
    assert ok.passed and len(ok.checked) == 3
    slow = judge(spec, "single", {"output_throughput": 54.1, "median_ttft_ms": 620.0},
                 {"output_throughput": 89.5})
    assert not slow.passed
    assert slow.misses == [
        "single: output_throughput 54.1 tok/s, expected >= 80.0 tok/s",
        "single: median_ttft_ms 620.0 ms, expected <= 500.0 ms",
        "single: output_throughput 54.1 tok/s vs last good 89.5 tok/s (-39.6%, "
        "tolerance -10%)",
    ]
    # no last good run: only the expectations
    assert judge(spec, "single", {"output_throughput": 81, "median_ttft_ms": 1}, None).passed
    # other scenarios are not judged by single's expectations
    assert judge(spec, "batch", {"output_throughput": 1.0}, None).checked == []
    missing = judge(spec, "single", {"median_ttft_ms": 1.0}, None)
    assert "output_throughput missing" in missing.misses[0]


# ------------------------------------------------------------ the shipped floors


def _notes() -> dict[str, float]:
    """The field notes' single-stream figures per profile, from their fixture."""
    import json

    path = Path(__file__).resolve().parents[2] / "fixtures/results/field-notes.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["profile"]: r["figures"]["output_throughput"] for r in rows}


def test_the_notes_eagle3_run_fails_its_floor_and_the_baseline_passes():
    """The field notes' EAGLE-3 (54.1 tok/s single stream) misses the eagle3 profile's
    floor, so its deploy fails and rolls back; the baseline's 89.5 passes tp8's."""
    notes = _notes()
    eagle = load_profile("glm5-nvfp4-tp8-eagle3").bench
    gate = judge(eagle, "single", {"output_throughput": notes["glm5-nvfp4-tp8-eagle3"]}, None)
    assert not gate.passed
    assert gate.misses == ["single: output_throughput 54.1 tok/s, expected >= 80.5 tok/s"]
    assert eagle.on_regression == "rollback"
    tp8 = load_profile("glm5-nvfp4-tp8").bench
    gate = judge(tp8, "single", {"output_throughput": notes["glm5-nvfp4-tp8"]}, None)
    assert gate.passed and gate.checked == [
        "single: output_throughput 89.5 tok/s, expected >= 80.5 tok/s"]
    assert judge(tp8, "batch", {"output_throughput": 225.0}, None).passed
    assert not judge(tp8, "batch", {"output_throughput": 160.0}, None).passed


def test_every_reference_box_profile_carries_the_notes_floors():
    for name in ("glm5-nvfp4-tp8", "glm5-nvfp4-tp8-ep8", "glm5-nvfp4-tp8-eagle3"):
        floors = {(e.scenario, e.figure, e.op): e.value
                  for e in load_profile(name).bench.expectations}
        # the notes' figures less 10 %, rounded down to the tenth
        assert floors == {("single", "output_throughput", ">="): pytest.approx(89.5 * 0.9,
                                                                              abs=0.1),
                          ("batch", "output_throughput", ">="): 225 * 0.9}, name
