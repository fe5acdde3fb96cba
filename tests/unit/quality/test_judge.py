"""gpuserve.quality.judge: a run against its reference, per metric (runs built from
parsed-reply fields as collect.py fills them)."""

from __future__ import annotations

import math

from gpuserve.launch.quality_spec import QualitySpec
from gpuserve.quality.judge import judge, summary_line, verdict_lines
from gpuserve.quality.record import PromptResult, QualityRun

SPEC = QualitySpec()


def dist(peak: int, noise: float = 0.0) -> list[list[float]]:
    probs = {peak: 0.7 + noise, (peak + 1) % 50: 0.2 - noise, (peak + 2) % 50: 0.05}
    return [[t, math.log(p)] for t, p in probs.items()]


def completion(i: int, noise: float = 0.0, ids: list[int] | None = None, **kw) -> PromptResult:
    ids = ids if ids is not None else [(i + j) % 50 for j in range(16)]
    return PromptResult(id=f"completion-{i}", kind="completion", output_ids=ids,
                        text="x", finish="length", completion_tokens=len(ids),
                        forced=[dist(t, noise) for t in ids], **kw)


def task(i: int, right: bool) -> PromptResult:
    return PromptResult(id=f"arithmetic-{i}", kind="arithmetic", output_ids=[1, 2],
                        text=f" The answer is {i if right else i + 1} .", finish="stop",
                        completion_tokens=2, answer=str(i))


def run(prompts: list[PromptResult]) -> QualityRun:
    return QualityRun(host="h", profile="p", model="m", revision="r", sglang_version="0.5.23",
                      launch_hash="abc", timestamp="2026-12-06T10:00:00Z", prompts=prompts,
                      elapsed_s=1.2)


REF = run([completion(i) for i in range(8)] + [task(i, True) for i in range(30)])


def failed(verdict: dict) -> list[str]:
    return [f["metric"] for f in verdict["findings"] if not f["passed"]]


def test_the_reference_against_itself_passes_with_zero_kld():
    cand = run([completion(i) for i in range(8)] + [task(i, True) for i in range(30)])
    v = judge(cand, REF, SPEC, "m@r.json")
    assert v["passed"] and cand.figures["kld_mean"] == 0.0
    assert cand.figures["greedy_agreement"] == 1.0
    assert "KLD mean 0" in summary_line(cand)


def test_small_noise_passes_and_records_its_kld():
    cand = run([completion(i, noise=0.01) for i in range(8)] + [task(i, True) for i in range(30)])
    v = judge(cand, REF, SPEC, "m@r.json")
    assert v["passed"] and 0 < cand.figures["kld_mean"] < SPEC.kld_mean_max


def test_nan_logprobs_fail_naming_the_metric_and_the_reference():
    bad = [completion(i, non_finite=5 if i == 0 else 0, first_non_finite=3 if i == 0 else None)
           for i in range(8)]
    v = judge(run(bad + [task(i, True) for i in range(30)]), REF, SPEC, "m@r.json")
    assert failed(v) == ["non_finite_logprobs"]
    line = verdict_lines(v)[0]
    assert "non_finite_logprobs 5" in line and "limit 0" in line and "m@r.json" in line
    assert "completion-0 at token 3" in line


def test_a_flat_distribution_and_looping_output_fail_kld_loops_and_agreement():
    flat = [[t, math.log(1 / 50)] for t in range(3)]
    bad = [PromptResult(id=f"completion-{i}", kind="completion", output_ids=[0] * 16, text="!",
                        finish="length", completion_tokens=16, forced=[flat] * 16)
           for i in range(8)]
    v = judge(run(bad + [task(i, True) for i in range(30)]), REF, SPEC, "m@r.json")
    assert {"kld_mean", "kld_p99", "greedy_agreement", "repetition_loops"} <= set(failed(v))


def test_a_significant_accuracy_drop_fails_a_small_one_does_not():
    few = run([completion(i) for i in range(8)]
              + [task(i, i >= 2) for i in range(30)])  # 2 of 30 lost: p = 0.25
    assert judge(few, REF, SPEC, "r")["passed"]
    many = run([completion(i) for i in range(8)] + [task(i, i >= 12) for i in range(30)])
    v = judge(many, REF, SPEC, "r")
    assert failed(v) == ["arithmetic_accuracy"]
    assert many.figures["arithmetic_accuracy"] == 0.6


def test_a_draft_that_accepts_nothing_is_named():
    spec = QualitySpec(expected_accept_length=3.0)
    prompts = [completion(i, verify_ct=15) for i in range(8)] + [task(i, True) for i in range(30)]
    v = judge(run(prompts), REF, spec, "r")
    assert failed(v) == ["spec_accept_length"]
    assert "rejected" in verdict_lines(v)[0]


def test_without_a_reference_only_sanity_is_judged():
    cand = run([completion(i) for i in range(3)] + [task(0, True)])
    v = judge(cand, None, SPEC, None)
    assert v["passed"] and "kld_mean" not in cand.figures
    aborted = run([PromptResult(id="completion-0", kind="completion", finish="abort")])
    assert set(failed(judge(aborted, None, SPEC, None))) == {"empty_outputs", "bad_finish_reasons"}
