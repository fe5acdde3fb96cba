"""The planner refuses a TP / attention-DP split SGLang itself refuses (heads that do not
divide), as the doctor's tp-heads-divisible rule does; the vocabulary is padded by SGLang."""

from __future__ import annotations

import pytest

from gpuserve.cli import main
from gpuserve.memory.models import load_record
from gpuserve.memory.planner import Layout, PlanRequest, heads_problems, predict

H200 = 143771


def test_llama70b_tp3_is_invalid_naming_tp_and_heads():
    llama = load_record("llama-3.1-70b")  # 64 attention heads, 8 KV heads
    plan = predict(llama, PlanRequest(gpu_memory_mib=H200, gpu_count=3, layout=Layout(tp=3)))
    assert plan.verdict == "invalid"
    assert any(p.startswith("--tp 3 (tp_size): llama-3.1-70b's num_attention_heads 64 do not "
                            "split over 3 ranks (64 % 3 = 1)") for p in plan.problems)
    assert any("num_key_value_heads 8" in p and "8 % 3 = 2" in p for p in plan.problems)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_dividing_tp_is_accepted(tp):
    assert heads_problems(load_record("llama-3.1-70b"), Layout(tp=tp)) == []


def test_kv_heads_fewer_than_tp_must_divide_it():
    # qwen3-30b-a3b: 32 heads, 4 KV heads; tp 8 replicates each KV head over 2 ranks
    qwen = load_record("qwen3-30b-a3b")
    assert heads_problems(qwen, Layout(tp=8)) == []
    assert qwen.num_kv_heads == 4


def test_attention_dp_shrinks_the_group():
    llama = load_record("llama-3.1-70b")
    # tp 6 alone fails; attention-DP 2 leaves attention TP 3, which still fails
    msgs = heads_problems(llama, Layout(tp=6, attn_dp=2))
    assert msgs and msgs[0].startswith("--tp 6 (tp_size) / --attn-dp 2 = attention TP 3")
    assert heads_problems(llama, Layout(tp=8, attn_dp=2)) == []


def test_mla_checks_attention_heads_only():
    dsv3 = load_record("deepseek-v3")  # MLA: 128 heads, no separate KV heads to shard
    assert heads_problems(dsv3, Layout(tp=8)) == []
    assert heads_problems(dsv3, Layout(tp=3))  # 128 % 3


def test_cli_exits_2_with_the_message(capsys):
    rc = main(["plan", "--model", "llama-3.1-70b", "--gpus", "3xH200", "--tp", "3"])
    assert rc == 2
    out = capsys.readouterr().out
    assert "verdict: invalid" in out and "num_attention_heads 64" in out
