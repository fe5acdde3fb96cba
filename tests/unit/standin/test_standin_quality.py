"""The stand-in's toy language model and its perturbations, measured the way the serve
deploy measures a launch: the host script sglang_quality.py against a stand-in server on
loopback, its output read and judged by gpuserve.quality against a reference launch.

Each perturbation is composed (lab/sglang_standin/README.md); the thresholds are the
profile defaults. Servers run fast (decode and prefill knobs raised); every wait is
bounded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from standin_server import healthy_server, standin_env

from gpuserve import paths
from gpuserve.launch.quality_spec import QualitySpec
from gpuserve.quality.collect import read_output, request_spec
from gpuserve.quality.judge import judge
from gpuserve.quality.prompts import load_prompts
from gpuserve.quality.record import QualityRun

SPEC = QualitySpec()
PROMPTS = load_prompts(SPEC.max_new_tokens)
FAST = {"GPUSERVE_LAB_STANDIN_DECODE_TPS": "2000", "GPUSERVE_LAB_STANDIN_BATCH_DECODE_TPS": "0",
        "GPUSERVE_LAB_STANDIN_PREFILL_TPS": "1000000"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("models") / "toy"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"vocab_size": 263}))
    return d


def measure(site: Path, model_dir: Path, tmp: Path, perturbation: str,
            ref: QualityRun | None, flags: tuple[str, ...] = ()) -> QualityRun:
    env = standin_env(site, GPUSERVE_LAB_STANDIN_QUALITY=perturbation, **FAST)
    forced = ({p.id: p.output_ids for p in ref.prompts if p.kind == "completion"}
              if ref else None)
    spec = request_spec(PROMPTS, SPEC.top_k, 60, forced)
    with healthy_server(model_dir, "toy", flags, env, log=tmp / f"{perturbation}.log") as port:
        out = subprocess.run([sys.executable, str(paths.SCRIPTS_DIR / "sglang_quality.py"),
                              "--port", str(port), "--spec", spec],
                             capture_output=True, text=True, timeout=90, check=True).stdout
    results, elapsed = read_output(out, PROMPTS)
    return QualityRun(host="h", profile=perturbation or "reference", model="toy",
                      revision=None, sglang_version="0.5.23", launch_hash=perturbation,
                      timestamp="2026-12-06T10:00:00Z", prompts=results, elapsed_s=elapsed)


def failed(run: QualityRun) -> set[str]:
    return {f["metric"] for f in run.verdict["findings"] if not f["passed"]}


@pytest.fixture(scope="module")
def reference(site23, model_dir, tmp_path_factory) -> QualityRun:
    ref = measure(site23, model_dir, tmp_path_factory.mktemp("ref"), "", None)
    assert judge(ref, None, SPEC, None)["passed"], ref.verdict
    return ref


def test_the_reference_launch_answers_the_arithmetic_and_repeats_itself(
        site23, model_dir, tmp_path, reference):
    assert reference.figures["arithmetic_accuracy"] >= 0.85
    again = measure(site23, model_dir, tmp_path, "", reference)
    assert judge(again, reference, SPEC, "ref")["passed"]
    assert again.figures["kld_mean"] == pytest.approx(0.0, abs=1e-9)
    assert again.figures["greedy_agreement"] == 1.0


def test_fp8_kv_noise_passes_with_a_small_kld(site23, model_dir, tmp_path, reference):
    run = measure(site23, model_dir, tmp_path, "fp8_kv", reference)
    assert judge(run, reference, SPEC, "ref")["passed"], run.verdict
    assert 0 < run.figures["kld_mean"] < SPEC.kld_mean_max


@pytest.mark.parametrize("perturbation, metrics", [
    ("nan_after:8", {"non_finite_logprobs"}),
    ("flat", {"kld_mean", "kld_p99", "repetition_loops"}),
    ("degrade:40", {"arithmetic_accuracy"}),
])
def test_broken_and_degraded_launches_fail_naming_the_metric(
        site23, model_dir, tmp_path, reference, perturbation, metrics):
    run = measure(site23, model_dir, tmp_path, perturbation, reference)
    assert not judge(run, reference, SPEC, "ref")["passed"]
    assert metrics <= failed(run)


def test_a_draft_that_accepts_nothing_is_named(site23, model_dir, tmp_path, reference):
    flags = ("--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/d")
    spec = QualitySpec(expected_accept_length=2.0)
    run = measure(site23, model_dir, tmp_path, "draft_mismatch", reference, flags)
    judge(run, reference, spec, "ref")
    assert run.figures["accept_length"] == pytest.approx(1.0)
    assert "spec_accept_length" in failed(run)


RULES = """rules:
  - name: fp8 kv cache
    when: {kv_cache_dtype: fp8_e4m3}
    quality: fp8_kv
  - name: broken attention backend
    when: {attention_backend: triton}
    quality: nan_after:8
"""


def test_a_surface_rule_assigns_a_launchs_perturbations(tmp_path):
    from lab import surface

    path = tmp_path / "s.yaml"
    path.write_text("format: 1\nname: t\ndescription: a test surface\n"
                    "base: {decode_tps: 50}\n" + RULES)
    s = surface.load(path)
    assert s.quality_of({"kv_cache_dtype": "fp8_e4m3", "attention_backend": "triton"}) \
        == "fp8_kv,nan_after:8"
    assert s.quality_of({"kv_cache_dtype": "auto"}) == ""
    path.write_text(path.read_text().replace("nan_after:8", "nan_after:eight"))
    with pytest.raises(surface.SurfaceError, match=r"rules\[1\]\.quality"):
        surface.load(path)


def _post(port: int, body: dict) -> tuple[int, object]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/generate", body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_a_batch_is_answered_in_order_like_its_single_requests(site23, model_dir, tmp_path):
    # SGLang's batch form (io_struct.py GenerateReqInput: lists of text / input_ids, a
    # list of sampling_params or one for all), answered as a JSON list in order
    texts = [p.text for p in PROMPTS[:3]] + [PROMPTS[40].text]
    sps = [{"max_new_tokens": 8, "temperature": 0}] * 3 + [{"max_new_tokens": 4}]
    env = standin_env(site23, **FAST)
    with healthy_server(model_dir, "toy", (), env, log=tmp_path / "batch.log") as port:
        status, batch = _post(port, {"text": texts, "sampling_params": sps,
                                     "return_logprob": True, "logprob_start_len": [0, -1, 0, -1]})
        singles = [_post(port, {"text": t, "sampling_params": sp, "return_logprob": True,
                                "logprob_start_len": start})[1]
                   for t, sp, start in zip(texts, sps, [0, -1, 0, -1], strict=True)]
        ids = [[t[1] for t in b["meta_info"]["input_token_logprobs"]] for b in singles[:1]]
        forced_status, forced = _post(port, {
            "input_ids": ids + ids, "return_logprob": True, "top_logprobs_num": 3,
            "logprob_start_len": len(ids[0]) - 1, "sampling_params": {"max_new_tokens": 1}})
        bad_status, bad = _post(port, {"text": texts, "sampling_params": sps[:2]})
    assert status == 200 and isinstance(batch, list) and len(batch) == 4
    for got, want in zip(batch, singles, strict=True):
        assert got["output_ids"] == want["output_ids"] and got["text"] == want["text"]
        for key in ("input_token_logprobs", "output_token_logprobs", "finish_reason",
                    "prompt_tokens", "completion_tokens"):
            assert got["meta_info"][key] == want["meta_info"][key], key
    assert [len(b["output_ids"]) for b in batch][3] <= 4
    assert forced_status == 200 and len(forced) == 2 and forced[0] == forced[1] | {
        "meta_info": forced[1]["meta_info"] | {"e2e_latency": forced[0]["meta_info"][
            "e2e_latency"]}}
    assert bad_status == 400 and "sampling_params" in bad["error"]["message"]


def test_a_batch_pays_its_prefill_once_at_the_prefill_rate(site23, model_dir, tmp_path):
    # 4 prompts of 50 words, no two sharing a first word (so the prefix cache holds
    # nothing of them), at 1,000 prompt tokens/s: one batched prefill of all their tokens
    # takes at least their sum over the rate (a lower bound: a loaded machine can only add)
    import time

    texts = [" ".join([first] + ["the"] * 49) for first in ("a", "an", "of", "to")]
    env = standin_env(site23, **dict(FAST, GPUSERVE_LAB_STANDIN_PREFILL_TPS="1000"))
    with healthy_server(model_dir, "toy", (), env, log=tmp_path / "pace.log") as port:
        t0 = time.monotonic()
        status, batch = _post(port, {"text": texts, "return_logprob": True,
                                     "sampling_params": {"max_new_tokens": 2}})
        elapsed = time.monotonic() - t0
    assert status == 200
    tokens = sum(b["meta_info"]["prompt_tokens"] for b in batch)
    assert tokens == 200
    assert elapsed >= tokens / 1000
    assert all(b["meta_info"]["e2e_latency"] >= tokens / 1000 for b in batch)


def test_the_prefix_cache_prefills_only_what_sglang_would() -> None:
    """A prompt sharing a cached prefix prefills its tail only; never the last token; with
    input logprobs asked for, nothing past ``logprob_start_len`` comes from the cache
    (schedule_batch.py ``Req._compute_max_prefix_len``)."""
    import importlib.util

    path = Path(__file__).parents[3] / "lab/sglang_standin/src/sglang/_standin/toylm.py"
    spec = importlib.util.spec_from_file_location("standin_toylm", path)
    toylm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(toylm)
    cache = toylm.PrefixCache()
    shots = list(range(10, 110))  # a 100-token few-shot prefix
    assert cache.uncached({"input_ids": shots + [7, 8]}) == 102
    assert cache.uncached({"input_ids": shots + [9, 9, 9]}) == 3
    assert cache.uncached({"input_ids": shots + [7, 8]}) == 1  # all but the last token
    forced = {"input_ids": shots + [7, 8, 5, 5], "return_logprob": True,
              "logprob_start_len": 50}
    assert cache.uncached(forced) == 104 - 50
    assert cache.uncached({"input_ids": [1, 2, 3]}) == 3
    small = toylm.PrefixCache(size=1)
    small.uncached({"input_ids": shots})
    small.uncached({"input_ids": [1, 2, 3]})
    assert small.uncached({"input_ids": shots}) == 100  # evicted
