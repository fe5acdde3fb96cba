"""Throughput checks (roles/checks/bench.py) through pyinfra's real execution path with
the @fake connector: when they run, what they record, how a missed gate fails the host.

The host script's replies are scripted per command (``fake_responses``); the SGLang line
is the composed fixture tests/fixtures/bench/sglang-serving-composed.jsonl (real keys,
see its README), so the records and the gate read what the real client writes.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from gpuserve.launch.bench import BenchMode, BenchSpec, OnRegression, Scenario, parse_expectation
from gpuserve.measure.results import RecordSpec, read_results
from gpuserve.roles.checks.bench import throughput_checks
from gpuserve.serve.checks import BenchPlan
from tests.unit.conftest import run_fake_op

FIXTURE = (Path(__file__).resolve().parents[2] / "fixtures" / "bench"
           / "sglang-serving-composed.jsonl")
LINE = FIXTURE.read_text().splitlines()[0]
SINGLE = Scenario("single", concurrency=1, prompts=5, input_len=1024, output_len=512)


def plan(mode=BenchMode.AUTO, spec=None, on_regression=OnRegression.REPORT) -> BenchPlan:
    return BenchPlan(mode=mode, spec=spec or BenchSpec(scenarios=(SINGLE,), timeout_s=30),
                     fingerprint="sha256:new", on_regression=on_regression,
                     profile="glm5-nvfp4-tp8", python="/opt/v/bin/python", user="sglang",
                     port=30000, served_name="glm-5", tokenizer="/models/GLM-5-NVFP4",
                     config_path="", runs_dir="/opt/gpuserve/bench",
                     mark_path="/opt/gpuserve/bench/last-pass.json")


def record(tmp_path) -> RecordSpec:
    return RecordSpec(results_dir=str(tmp_path / "results"), profile="glm5-nvfp4-tp8",
                      launch_hash="sha256:" + "a" * 64, sglang_version="0.5.23",
                      model="/models/GLM-5-NVFP4", served_name="glm-5", lock="sglang-lock",
                      context={"gpus": {"name": "NVIDIA RTX PRO 6000", "count": 8}})


def status(state="done", **extra) -> str:
    doc = {"state": state, "done": 5, "total": 5, "elapsed": 12.0, "rc": 0, "tail": [],
           "line": LINE if state == "done" else None}
    doc.update(extra)
    return json.dumps(doc)


def run(bench_plan, responses, rec=None, **kwargs):
    return run_fake_op(throughput_checks, responses, plan=bench_plan,
                       script="/opt/gpuserve/bin/sglang_bench.py", record=rec, rollback=None,
                       health_script="/x/probe.py", health_timeout=5, interval=0.01,
                       report_every=0.05, **kwargs)


def test_measured_configuration_is_not_benchmarked_again(caplog):
    responses = {"last-pass.json": json.dumps({"fingerprint": "sha256:new"})}
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        meta, cmds = run(plan(), responses)
    assert meta.did_succeed() and not meta.did_change()
    assert not any(" start " in c for c in cmds)
    assert "bench: skipped" in caplog.text


def test_new_configuration_is_benchmarked_recorded_and_marked(tmp_path, caplog):
    responses = {"last-pass.json": json.dumps({"fingerprint": "sha256:old"}),
                 "sglang_bench.py status": status()}
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        meta, cmds = run(plan(), responses, rec=record(tmp_path))
    assert meta.did_succeed() and meta.did_change()
    start = next(c for c in cmds if "sglang_bench.py start" in c)
    for flag in ("--dataset-name", "random-ids", "--max-concurrency", "--random-range-ratio"):
        assert flag in start
    assert any("sglang_bench.py mark" in c and "sha256:new" in c for c in cmds)
    (rec,) = read_results(tmp_path / "results")
    assert (rec.kind, rec.scenario, rec.profile) == ("bench", "single", "glm5-nvfp4-tp8")
    assert rec.figures["output_throughput"] > 0 and rec.gate["passed"] is True
    raw = next((tmp_path / "results").rglob("*.json")).read_text()
    assert "sk-fixture-not-a-real-key" not in raw and "Infinity" not in raw
    assert "out tok/s" in caplog.text


def test_always_benchmarks_even_when_marked():
    responses = {"last-pass.json": json.dumps({"fingerprint": "sha256:new"}),
                 "sglang_bench.py status": status()}
    meta, cmds = run(plan(mode=BenchMode.ALWAYS), responses)
    assert meta.did_succeed() and any("sglang_bench.py start" in c for c in cmds)


def test_missed_expectation_fails_with_numbers_and_leaves_no_mark(tmp_path, caplog):
    def err(field, message):
        raise AssertionError(field + message)

    spec = BenchSpec(scenarios=(SINGLE,), expectations=(
        parse_expectation("single", "output_throughput", "100000 tok/s", "x", err),))
    responses = {"last-pass.json": "", "sglang_bench.py status": status()}
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        meta, cmds = run(plan(spec=spec), responses, rec=record(tmp_path))
    assert not meta.did_succeed()
    assert not any("sglang_bench.py mark" in c for c in cmds)
    assert "missed its throughput gate" in caplog.text
    assert "expected >= 100,000.0 tok/s" in caplog.text
    assert "keeps serving" in caplog.text
    (rec,) = read_results(tmp_path / "results")  # the miss is recorded, not lost
    assert rec.gate["passed"] is False


def test_regression_against_the_last_good_record(tmp_path, caplog):
    spec = BenchSpec(scenarios=(SINGLE,), regression_tolerance_pct=5.0)
    responses = {"last-pass.json": "", "sglang_bench.py status": status()}
    meta, _ = run(plan(spec=spec), responses, rec=record(tmp_path))
    assert meta.did_succeed()
    first = json.loads(LINE.replace("Infinity", "null"))["output_throughput"]
    slower = json.loads(LINE.replace("Infinity", "null"))
    slower["output_throughput"] = first * 0.5
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        meta, _ = run(plan(spec=spec), {"last-pass.json": "", "sglang_bench.py status":
                                        status(line=json.dumps(slower))}, rec=record(tmp_path))
    assert not meta.did_succeed()
    assert "-50.0%, tolerance -5%" in caplog.text


def test_client_failure_shows_its_last_lines(caplog):
    responses = {"last-pass.json": "", "sglang_bench.py status": status(
        "failed", rc=1, tail=["OSError: /models/GLM-5-NVFP4 is not a local folder"])}
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        meta, cmds = run(plan(), responses)
    assert not meta.did_succeed()
    assert "exited with status 1" in caplog.text and "not a local folder" in caplog.text


def test_timeout_stops_the_client(caplog):
    spec = BenchSpec(scenarios=(SINGLE,), timeout_s=0.2)
    responses = {"last-pass.json": "", "sglang_bench.py status": status(
        "running", done=2, rc=None)}
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        meta, cmds = run(plan(spec=spec), responses)
    assert not meta.did_succeed()
    assert any("sglang_bench.py stop" in c for c in cmds)
    assert "did not finish within 0 s" in caplog.text or "within" in caplog.text
    assert "2/5 requests" in caplog.text


def test_output_that_is_not_json_fails_naming_the_file(tmp_path, caplog):
    responses = {"last-pass.json": "", "sglang_bench.py status": status(
        line="Traceback (most recent call last): <not JSON>")}
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        meta, cmds = run(plan(), responses, rec=record(tmp_path))
    assert not meta.did_succeed()
    assert "bench: single:" in caplog.text and "/result.jsonl" in caplog.text
    assert not (tmp_path / "results").exists()  # nothing half-recorded
    assert not any("sglang_bench.py mark" in c for c in cmds)
