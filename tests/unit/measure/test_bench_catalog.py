"""The benchmark client's catalog: the argv the serve deploy builds, refusals, result keys."""

from __future__ import annotations

import math

import pytest

from gpuserve.errors import InputError
from gpuserve.launch.flagparser import build_parser
from gpuserve.measure.bench_catalog import (
    available_bench_versions,
    load_bench_catalog,
    output_keys,
)

DEPLOY = ["--backend", "sglang", "--base-url", "http://127.0.0.1:30000", "--model", "qwen",
          "--tokenizer", "/models/qwen", "--dataset-name", "random-ids",
          "--random-input-len", "1024", "--random-output-len", "256",
          "--random-range-ratio", "1.0", "--num-prompts", "80", "--max-concurrency", "16",
          "--warmup-requests", "2", "--output-file", "/var/lib/gpuserve/bench.jsonl",
          "--tag", "host-a/qwen"]


def test_versions_and_plain_flagparser_builds_the_catalog():
    assert available_bench_versions() == ["0.5.19", "0.5.23"]
    cat = load_bench_catalog("0.5.23+cu130")
    assert cat.version == "0.5.23" and cat.prog == "serving.py"
    # The catalog is in flag-catalog format: gpuserve's launch parser builder reads it.
    ns = build_parser(cat.data).parse_args(DEPLOY)
    assert ns.max_concurrency == 16


@pytest.mark.parametrize("version", ["0.5.19", "0.5.23"])
def test_deploy_argv_validates(version):
    ns = load_bench_catalog(version).validate(DEPLOY, "profiles/x.yaml", "bench")
    assert ns.dataset_name == "random-ids" and ns.random_range_ratio == 1.0
    assert ns.num_prompts == 80 and ns.warmup_requests == 2 and ns.tag == "host-a/qwen"
    assert math.isinf(ns.request_rate)  # default: everything at t=0
    assert ns.ready_check_timeout_sec == 60


def test_typo_flag_is_refused_with_argparse_message():
    with pytest.raises(InputError) as e:
        load_bench_catalog("0.5.23").validate([*DEPLOY, "--max-concurency", "4"],
                                              "profiles/x.yaml", "bench")
    assert str(e.value) == ("profiles/x.yaml: bench: SGLang 0.5.23 benchmark client "
                            "(serving.py): unrecognized arguments: --max-concurency 4")


@pytest.mark.parametrize("argv, message", [
    (["--dataset-name", "random-idz"], "argument --dataset-name: invalid choice: "
     "'random-idz'"),
    (["--num-prompts", "ten"], "argument --num-prompts: invalid int value: 'ten'"),
    (["--random-"], "ambiguous option: --random- could match"),
    (["--flush-cache-timeout", "0"], "argument --flush-cache-timeout: expected a finite "
     "float > 0, got '0'"),
    (["--goodput", "itl:5"], "argument --goodput: expected KEY:VALUE with KEY in "
     "ttft, tpot, e2el, got 'itl:5'"),
    (["--rust-worker-threads", "4"], "--rust-worker-threads requires --rust-client"),
    (["--rust-client", "--dataset-name", "custom"], "--rust-client does not implement "
     "--dataset-name custom"),
    (["--profile-prefill-url", "a", "--profile-decode-url", "b"],
     "argument --profile-decode-url: not allowed with argument --profile-prefill-url"),
])
def test_refusals_of_the_real_client(argv, message):
    with pytest.raises(ValueError, match=None) as e:
        load_bench_catalog("0.5.23").parse(argv)
    assert str(e.value).startswith(message)


def test_rules_follow_the_version():
    argv = ["--dataset-name", "generated-shared-prefix", "--tokenize-prompt",
            "--gsp-num-turns", "2"]
    with pytest.raises(ValueError, match="--tokenize-prompt requires --gsp-num-turns=1"):
        load_bench_catalog("0.5.23").parse(argv)
    assert load_bench_catalog("0.5.19").parse(argv).gsp_num_turns == 2
    with pytest.raises(ValueError, match="unrecognized arguments: --rust-client"):
        load_bench_catalog("0.5.19").parse(["--rust-client"])


def test_abbreviation_is_accepted_like_argparse():
    ns = load_bench_catalog("0.5.23").parse(["--num-prompt", "8", "--random-output", "4"])
    assert (ns.num_prompts, ns.random_output_len) == (8, 4)


def test_output_keys_and_conditional_keys():
    keys = output_keys("0.5.23")
    assert keys[:4] == ("tag", "backend", "dataset_name", "request_rate")
    assert {"server_info", "completed", "total_output_tokens", "output_throughput",
            "median_ttft_ms", "p99_itl_ms", "concurrency", "max_concurrent_requests"} <= set(keys)
    cat = load_bench_catalog("0.5.23")
    assert cat.result_keys(cat.parse(DEPLOY)) == keys
    more = cat.result_keys(cat.parse([*DEPLOY, "--output-details", "--goodput", "ttft:500"]))
    assert set(more) - set(keys) == {"goodput_slos_ms", "request_goodput", "slo_attainment",
                                     "slo_attainment_by_metric", "input_lens", "output_lens",
                                     "ttfts", "itls", "generated_texts", "errors"}


def test_unknown_version():
    with pytest.raises(InputError, match="no benchmark-client catalog for SGLang '0.4.0'"):
        load_bench_catalog("0.4.0")
