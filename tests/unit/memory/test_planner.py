"""Memory planner: SGLang default choices, weights, KV cell size, budget and verdicts."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from gpuserve.cli import main
from gpuserve.errors import InputError
from gpuserve.host.gpus import get_gpu, parse_gpus
from gpuserve.launch.catalog import available_versions, load_catalog
from gpuserve.memory.memory_defaults import (
    KNOWN_VERSIONS,
    MemorySettings,
    capacity_defaults,
    decode_capture_sizes,
    memory_defaults,
    prefill_capture_sizes,
)
from gpuserve.memory.models import load_record
from gpuserve.memory.planner import (
    ACTIVATION_MIB_PER_TOKEN,
    GIB,
    Layout,
    PlanRequest,
    budget,
    decode_bs_flag,
    heads_problems,
    kv_cell,
    predict,
    resolve_max_running_requests,
    sglang_need_mb,
    weights_per_gpu,
)
from gpuserve.memory.planner_cases import evaluate, format_table, load_cases
from gpuserve.terminal import signed_term

G_PRO6000 = 97887  # nvidia-smi memory.total of an RTX PRO 6000 (MiB)


# sglang.md §2 worked values (G = 97,887 MiB, cps 8192, max_bs 512 unless stated)
@pytest.mark.parametrize(
    ("kwargs", "mfs", "reserved"),
    [
        (dict(tp=8, use_mla=True), 0.833, 16384),
        (dict(tp=8, use_mla=False), 0.844, None),
        (dict(tp=8, use_mla=True, decode_max_bs=256), 0.838, None),
        (dict(tp=8, use_mla=True, attn_dp=8), 0.644, 34816),
        (dict(tp=8, use_mla=True, attn_dp=8, decode_max_bs=128), 0.809, None),
        (dict(tp=8, use_mla=True, moe_a2a_backend="deepep"), 0.801, None),
    ],
)
def test_default_mem_fraction_worked_values(kwargs, mfs, reserved):
    d = memory_defaults(G_PRO6000, MemorySettings(version="0.5.23", **kwargs))
    assert d.mem_fraction_static == mfs
    if reserved is not None:
        assert d.reserved_mb == reserved


# sglang.md §3 G thresholds: (G GiB, tp) -> (cps, decode max_bs), per version
@pytest.mark.parametrize(
    ("gib", "tp", "v23", "v19"),
    [
        (16, 1, (2048, 8), (2048, 8)),
        (24, 1, (4096, 48), (2048, 24)),
        (32, 8, (4096, 160), (2048, 80)),
        (48, 2, (4096, 32), (4096, 32)),
        (48, 4, (4096, 160), (4096, 160)),
        (80, 2, (8192, 256), (8192, 256)),
        (80, 8, (8192, 512), (8192, 512)),
        (95.59, 2, (8192, 256), (8192, 256)),
        (95.59, 8, (8192, 512), (8192, 512)),
        (180, 1, (16384, 512), (16384, 512)),
    ],
)
def test_capacity_tiers(gib, tp, v23, v19):
    assert capacity_defaults(gib * 1024, tp, "0.5.23") == v23
    assert capacity_defaults(gib * 1024, tp, "0.5.19") == v19


def test_unknown_gpu_memory_defaults_differ_by_version():
    assert memory_defaults(None, MemorySettings(version="0.5.23")).mem_fraction_static == 0.95
    assert memory_defaults(None, MemorySettings(version="0.5.19")).mem_fraction_static == 0.88
    assert capacity_defaults(None, 8) == (4096, 160)


def test_max_running_requests_caps_max_bs_only_in_0_5_23():
    assert memory_defaults(G_PRO6000, MemorySettings(tp=8, max_running_requests=48)
                           ).decode_max_bs == 48
    assert (
        memory_defaults(G_PRO6000, MemorySettings(tp=8, max_running_requests=48,
                                                  version="0.5.19")).decode_max_bs
        == 512
    )


def test_small_gpu_reserve_follows_the_formula_without_floor():
    # 24 GiB card, tp1, GQA: R = 512 + 1.5*4096 + 128 + 2*48 + 8*50 prefill captures
    d = memory_defaults(24 * 1024, MemorySettings(tp=1))
    assert len(prefill_capture_sizes(4096)) == 50
    assert d.reserved_mb == 512 + 6144 + 128 + 96 + 400
    assert d.mem_fraction_static == round((24576 - d.reserved_mb) / 24576, 3)
    assert "floor_10GiB" not in d.reserve_breakdown


def test_attention_dp_splits_chunked_prefill_after_the_fraction():
    d = memory_defaults(G_PRO6000, MemorySettings(tp=8, attn_dp=8, use_mla=True))
    assert d.chunked_prefill_size == 8192 and d.chunked_prefill_size_per_dp == 1024


def test_capture_sizes():
    assert len(prefill_capture_sizes(8192)) == 58
    sizes = decode_capture_sizes(512)
    assert sizes[:5] == [1, 2, 4, 8, 12] and sizes[-1] == 512
    assert decode_capture_sizes(100)[-1] == 100


def test_kv_cell_sizes():
    dsv3 = load_record("deepseek-v3")
    assert kv_cell(dsv3, kv_dtype="bf16", attn_tp=8).bytes_per_token == 70272
    assert kv_cell(dsv3, kv_dtype="fp8_e4m3").bytes_per_token == 35136
    glm = load_record("glm-5-nvfp4")
    # SM120 + fp8 -> flashinfer_sparse_mla: scaled row 656 B + indexer 132 B, 78 layers
    assert kv_cell(glm, kv_dtype="fp8_e4m3", sm_major=12).bytes_per_token == 78 * (656 + 132)
    # SM100 fp8 -> trtllm: raw 576-byte row
    assert kv_cell(glm, kv_dtype="fp8_e4m3", sm_major=10).bytes_per_token == 78 * (576 + 132)
    assert kv_cell(glm, kv_dtype="bf16", sm_major=12).bytes_per_token == 78 * 1152 + 78 * 132
    qwen = load_record("qwen3-235b-a22b-fp8")
    assert kv_cell(qwen, kv_dtype="bf16", attn_tp=4).bytes_per_token == 48128
    assert kv_cell(qwen, kv_dtype="bf16", attn_tp=2).bytes_per_token == 2 * 48128
    assert kv_cell(qwen, kv_dtype="mxfp8", attn_tp=4).bytes_per_token == 24064 + 24064 // 32
    # nvfp4 MLA: 576 / 2 + 576 / 16 scale bytes per layer
    assert kv_cell(dsv3, kv_dtype="nvfp4").bytes_per_token == 61 * (288 + 36)
    assert kv_cell(glm, kv_dtype="nvfp4", sm_major=12).bytes_per_token == 78 * (324 + 132)
    with pytest.raises(ValueError):
        kv_cell(qwen, kv_dtype="nvfp4")
    # one EAGLE/MTP draft layer adds cell / L
    assert kv_cell(dsv3, kv_dtype="bf16", draft=1).bytes_per_token == 70272 + 1152


def test_weights_tp_vs_ep_for_glm5_nvfp4():
    glm = load_record("glm-5-nvfp4")
    tp = weights_per_gpu(glm, Layout(tp=8))
    ep = weights_per_gpu(glm, Layout(tp=8, ep=8, moe_a2a_backend="flashinfer"))
    total_tp = sum(p.gib for p in tp)
    # InferenceX PR #2335: "about 56 GB weights per GPU" at TP8 on 8x RTX PRO 6000
    assert total_tp == pytest.approx(56, rel=0.05)
    routed = {p.name: p.gib for p in tp}["routed experts x75 layers"]
    assert routed == pytest.approx({p.name: p.gib for p in ep}["routed experts x75 layers"])
    # The a2a backend replicates the BF16 shared expert: 75 x 3 x 6144 x 2048 x 2 B x 7/8
    extra = sum(p.gib for p in ep) - total_tp
    assert extra == pytest.approx(75 * 3 * 6144 * 2048 * 2 * 7 / 8 / GIB, rel=1e-6)
    # ...which explains most of the 21.7 - 16.3 = 5.4 GiB the field notes measured
    assert 0.8 * 5.4 < extra < 5.4


def test_redundant_experts_add_whole_experts():
    glm = load_record("glm-5-nvfp4")
    base = sum(p.gib for p in weights_per_gpu(glm, Layout(tp=8, ep=8)))
    more = sum(p.gib for p in weights_per_gpu(glm, Layout(tp=8, ep=8, num_redundant_experts=8)))
    per_expert = 3 * 6144 * 2048 * (0.5 + 1 / 16) * 75 / GIB
    assert more - base == pytest.approx(per_expert, rel=1e-6)


def test_attention_dp_replicates_attention():
    dsv3 = load_record("deepseek-v3")
    tp = {p.name: p.gib for p in weights_per_gpu(dsv3, Layout(tp=8))}
    dp = {p.name: p.gib for p in weights_per_gpu(dsv3, Layout(tp=8, attn_dp=8))}
    assert dp["attention (sharded)"] == pytest.approx(8 * tp["attention (sharded)"])
    assert dp["routed experts x58 layers"] == tp["routed experts x58 layers"]
    assert dp["embedding"] == pytest.approx(8 * tp["embedding"])  # attn_tp group only
    assert dp["lm_head"] == tp["lm_head"]


def test_seed_diagnosis_from_field_note_figures():
    tp = budget(94, 21.7, 0.78)
    assert tp.rest_gib == pytest.approx(1.02, abs=0.005)
    ep = budget(94, 16.3, 0.78)
    assert ep.refused and ep.rest_gib == pytest.approx(-4.38, abs=0.005)
    assert ep.min_viable_mfs == pytest.approx(0.8266, abs=5e-5)
    assert ep.suggested_mfs == 0.827
    assert budget(94, 16.3, ep.suggested_mfs).rest_gib > 0


def test_budget_tokens_round_to_page():
    b = budget(94, 21.7, 0.78, cell_bytes=61464, page_size=64)
    assert b.kv_tokens % 64 == 0
    assert b.kv_tokens == int(1.02 * GIB) // 61464 // 64 * 64


def test_predict_glm5_ep8_loses_free_memory_like_the_field_notes():
    count, gpu = parse_gpus("8xRTX-PRO-6000")
    glm = load_record("glm-5-nvfp4")
    common = dict(
        gpu_memory_mib=gpu.memory_total_mib,
        gpu_count=count,
        sm_major=12,
        mem_fraction_static=0.78,
        kv_cache_dtype="fp8_e4m3",
        pre_load_free_gib=94,
    )
    tp = predict(glm, PlanRequest(layout=Layout(tp=8), **common))
    ep = predict(glm,
        PlanRequest(layout=Layout(tp=8, ep=8, moe_a2a_backend="flashinfer"), **common))
    # field notes: 21.7 GB free after weights under TP, 16.3 GB under EP
    assert tp.avail_after_weights_gib - ep.avail_after_weights_gib == pytest.approx(5.4, abs=0.3)
    assert ep.kv_tokens < tp.kv_tokens


def test_predict_refused_launch_gets_a_fraction_that_fits():
    count, gpu = parse_gpus("8xH100")
    dsv3 = load_record("deepseek-v3")
    plan = predict(
        dsv3,
        PlanRequest(gpu_memory_mib=gpu.memory_total_mib,
        gpu_count=count,
        sm_major=9,
        layout=Layout(tp=8),
        kv_cache_dtype="fp8_e4m3",
        context_length=4096,
        pre_load_free_gib=77.0),
    )
    # 79 GiB of FP8 weights on 77 GiB free: nothing can fit
    assert plan.weights_gib > 77 and plan.verdict == "refused"
    assert plan.min_viable_mfs > 1
    assert not any(c.startswith("raise --mem-fraction-static") for c in plan.changes)
    smaller = predict(
        load_record("qwen3-235b-a22b-fp8"),
        PlanRequest(gpu_memory_mib=gpu.memory_total_mib,
        gpu_count=count,
        sm_major=9,
        layout=Layout(tp=8, ep=8),
        mem_fraction_static=0.30,
        context_length=40960),
    )
    assert smaller.verdict == "refused"
    fix = float(smaller.changes[0].split(" to ")[1].split()[0])
    assert smaller.changes[0].startswith("raise --mem-fraction-static to")
    assert fix > smaller.min_viable_mfs
    again = predict(
        load_record("qwen3-235b-a22b-fp8"),
        PlanRequest(gpu_memory_mib=gpu.memory_total_mib,
        gpu_count=count,
        sm_major=9,
        layout=Layout(tp=8, ep=8),
        mem_fraction_static=fix,
        context_length=40960),
    )
    assert again.verdict == "fits" and again.kv_tokens >= 40960


def test_predict_default_fraction_on_h200_fits():
    count, gpu = parse_gpus("8xH200")
    plan = predict(
        load_record("deepseek-v3"),
        PlanRequest(gpu_memory_mib=gpu.memory_total_mib,
        gpu_count=count,
        sm_major=gpu.sm_major,
        layout=Layout(tp=8),
        context_length=32768),
    )
    assert plan.defaults["mem_fraction_static"] == plan.mem_fraction_static
    assert plan.verdict == "fits" and plan.kv_tokens > 32768
    assert plan.kv_cell["bytes_per_token"] == 70272


def test_predict_too_small_gpu_suggests_fp8_and_higher_fraction():
    count, gpu = parse_gpus("8xH200")  # 75 GiB/GPU of DeepSeek-V3 weights leave room
    plan = predict(load_record("deepseek-v3"), PlanRequest(gpu_memory_mib=gpu.memory_total_mib,
                   gpu_count=count, sm_major=9, layout=Layout(tp=8), mem_fraction_static=0.5))
    assert plan.verdict in ("refused", "no-kv", "tight")
    assert any("fp8_e4m3" in c for c in plan.changes)
    assert plan.changes[0].startswith("raise --mem-fraction-static to 0.")


def test_weights_over_the_gpu_get_no_fraction_above_1_and_no_minus_minus():
    """DeepSeek-V3 FP8 at TP8 on 80 GB cards: the weights alone exceed what is free, so
    no fraction fits; the planner says what would and writes the negative term as such."""
    count, gpu = parse_gpus("8xH100")
    plan = predict(load_record("deepseek-v3"), PlanRequest(gpu_memory_mib=gpu.memory_total_mib,
                   gpu_count=count, sm_major=9, layout=Layout(tp=8)))
    assert plan.verdict == "refused" and plan.avail_after_weights_gib < 0
    text = "\n".join(plan.explanation + plan.changes)
    assert not re.search(r"-\s*-\s*\d", text), text
    assert signed_term(plan.avail_after_weights_gib) == f"+ {-plan.avail_after_weights_gib:.2f}"
    assert plan.changes[0].startswith("no mem_fraction_static fits") and "--tp" in plan.changes[0]
    fractions = [float(f) for f in re.findall(r"mem.fraction.static (?:to )?(\d+\.\d+)", text)]
    assert all(f < 1 for f in fractions), fractions


def test_block_fp8_experts_need_whole_blocks_per_shard():
    qwen = load_record("qwen3-235b-a22b-fp8")  # moe_intermediate 1536, 128x128 blocks
    assert any("not divisible by the fp8 block 128" in e for e in Layout(tp=8).validate(qwen))
    assert not Layout(tp=8, ep=8).validate(qwen)
    assert not Layout(tp=4).validate(qwen)  # 384 per shard


def test_invalid_layouts_are_reported():
    glm = load_record("glm-5-nvfp4")
    assert Layout(tp=8, ep=3).validate(glm)
    assert Layout(tp=8, ep=4, moe_a2a_backend="deepep").validate(glm)
    assert not Layout(tp=8, ep=8, moe_a2a_backend="deepep").validate(glm)
    plan = predict(glm, PlanRequest(gpu_memory_mib=G_PRO6000, gpu_count=4, layout=Layout(tp=8)))
    assert plan.verdict == "invalid"


def test_max_running_requests_rule():
    # sglang #11208: max_total_num_tokens=1339395, context_len=131072 -> max_running_requests=4096
    assert resolve_max_running_requests(1339395, 131072) == 4096
    assert resolve_max_running_requests(100_000, 131072) == 2048
    assert resolve_max_running_requests(3000, 131072) == 1500  # tokens // 2
    assert resolve_max_running_requests(1_000_000, 8192, requested=256, attn_dp=8) == 32


def test_draft_layers_by_algorithm():
    from gpuserve.memory.planner import draft_layers

    glm, llama = load_record("glm-5-nvfp4"), load_record("llama-3.1-70b")
    assert draft_layers(glm, Layout(speculative="NEXTN")) == 1  # num_nextn_predict_layers
    assert draft_layers(glm, Layout(speculative="EAGLE")) == 1
    assert draft_layers(llama, Layout(speculative="EAGLE3")) == 1
    assert draft_layers(llama, Layout(speculative="NGRAM")) == 0
    assert draft_layers(llama, Layout()) == 0
    with_mtp = weights_per_gpu(glm, Layout(tp=8, speculative="NEXTN"))
    assert any(p.name.startswith("draft/MTP") for p in with_mtp)
    # a separate EAGLE3 head is not one of the checkpoint's layers: weights come from the user
    eagle3 = weights_per_gpu(glm, Layout(tp=8, speculative="EAGLE3"))
    assert not any(p.name.startswith("draft/MTP") for p in eagle3)


def test_reserve_shrinking_suggestion_is_actionable():
    dsv3 = load_record("deepseek-v3")
    common = dict(gpu_memory_mib=G_PRO6000, gpu_count=8, sm_major=12, init_overhead_gib=2.29)
    plan = predict(dsv3, PlanRequest(layout=Layout(tp=8), **common))
    assert plan.verdict == "refused" and plan.mem_fraction_static == 0.833
    tip = next(c for c in plan.changes if "--chunked-prefill-size" in c)
    cps = int(tip.split("--chunked-prefill-size ")[1].split()[0])
    mfs = float(tip.split("--mem-fraction-static ")[1].split()[0])
    applied = predict(dsv3, PlanRequest(layout=Layout(tp=8), chunked_prefill_size=cps,
                                        mem_fraction_static=mfs, **common))
    assert applied.kv_tokens > 0 and applied.verdict in ("fits", "tight")
    assert mfs <= applied.max_safe_mfs
    # 0.5.19 spells the decode graph flag without the -decode suffix
    old = predict(dsv3, PlanRequest(layout=Layout(tp=8), version="0.5.19", **common))
    assert not any("--cuda-graph-max-bs-decode" in c for c in old.changes)


# --------------------------------------------------------------------------------------
# --pre-load-free-gib is bounded by the card's memory.total (gpus.yaml).


H200 = 143771  # gpus.yaml memory_total_mib


def test_free_memory_above_the_card_is_refused():
    with pytest.raises(InputError) as exc:
        predict(load_record("llama-3.1-70b"), PlanRequest(gpu_memory_mib=H200, gpu_count=8,
                layout=Layout(tp=8), pre_load_free_gib=200))
    assert exc.value.field == "pre_load_free_gib"
    assert "more than the GPU holds (memory.total 143771 MiB = 140.40 GiB)" in str(exc.value)


def test_free_memory_up_to_the_card_is_planned():
    plan = predict(load_record("llama-3.1-70b"), PlanRequest(gpu_memory_mib=H200, gpu_count=8,
                   layout=Layout(tp=8), pre_load_free_gib=137.29))
    assert plan.pre_load_free_gib == 137.29 and plan.verdict != "invalid"


def test_cli_names_the_flag(capsys):
    rc = main(["plan", "--model", "llama-3.1-70b", "--gpus", "8xH200", "--tp", "8",
               "--pre-load-free-gib", "200"])
    assert rc == 2
    assert "--pre-load-free-gib: pre_load_free_gib: 200 GiB" in capsys.readouterr().err


# --------------------------------------------------------------------------------------
# The planner refuses a TP / attention-DP split SGLang itself refuses (heads that do not divide), as
# the doctor's tp-heads-divisible rule does; the vocabulary is padded by SGLang.


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


# --------------------------------------------------------------------------------------
# The planner's "max safe" mem_fraction_static: the highest fraction whose memory outside the static
# pool (pre x (1 - m), what stays free after SGLang sizes the KV pool) still holds what SGLang
# allocates there at the launch's graph size and chunk size.
#
# It used to be SGLang's own default, whose reserve is a default-choosing heuristic (1.5 MiB per
# chunked-prefill token, a 10 GiB floor on large cards): "keep mfs <= 0.840" on every shipped GLM-5
# profile, although the field notes ran TP8 at 0.92 with decode graphs to bs 128 (7.52 GiB free
# after the pool) and a public guide ran 0.92 on the same GPUs (7.43-7.53 GB).


PRE = 93.30  # "Load weight begin. avail mem=93.30 GB" (sglang#29562, memory_cases.jsonl 22)
COMMON = dict(gpu_memory_mib=G_PRO6000, gpu_count=8, sm_major=12, pre_load_free_gib=PRE)


def _warns(plan) -> bool:
    return any("CUDA graph capture may OOM" in c for c in plan.changes)


@pytest.mark.parametrize("max_bs", [None, 128, 256])
def test_sglang_default_fraction_does_not_warn(max_bs):
    """SGLang's default keeps its whole reserve outside the pool, padding included, so it
    sits below the ceiling and never warns."""
    glm = load_record("glm-5-nvfp4")
    plan = predict(glm, PlanRequest(layout=Layout(tp=8), cuda_graph_max_bs=max_bs, **COMMON))
    d = memory_defaults(G_PRO6000, MemorySettings(tp=8, use_mla=True, decode_max_bs=max_bs))
    assert plan.defaults["mem_fraction_is_default"]
    assert plan.mem_fraction_static == d.mem_fraction_static < plan.max_safe_mfs
    assert plan.verdict == "fits" and not _warns(plan)


def test_the_need_is_sglangs_terms_without_its_padding():
    """At decode graphs to bs 128 and 8192-token chunks: SGLang's metadata (512 MiB),
    workspaces (tp 8: 1024), graphs (2 x 128 + 1536 for MLA prefill graphs) as its hook
    computes them, and activations at the measured 0.5 MiB/token, not its 1.5 heuristic."""
    d = memory_defaults(G_PRO6000, MemorySettings(tp=8, use_mla=True, decode_max_bs=128))
    need = sglang_need_mb(d)
    assert d.reserve_breakdown["activations"] == 8192 * 1.5
    assert need["activations"] == 8192 * ACTIVATION_MIB_PER_TOKEN
    assert {k: need[k] for k in ("constant", "parallel", "cuda_graphs")} == \
        {"constant": 512, "parallel": 1024, "cuda_graphs": 2 * 128 + 1536}
    plan = predict(load_record("glm-5-nvfp4"),
        PlanRequest(layout=Layout(tp=8), cuda_graph_max_bs=128,
                   **COMMON))
    assert plan.graph_reserve_gib == pytest.approx(sum(need.values()) / 1024)
    assert plan.max_safe_mfs == math.floor((1 - sum(need.values()) / 1024 / PRE) * 1000) / 1000


def test_the_10_gib_floor_is_padding_not_need():
    """With 2048-token chunks SGLang's reserve falls under 10 GiB and its floor fills the
    rest: the floor picks SGLang's default, nothing allocates it."""
    d = memory_defaults(G_PRO6000, MemorySettings(tp=8, use_mla=True, decode_max_bs=128,
                        chunked_prefill_size=2048))
    assert d.reserve_breakdown["floor_10GiB"] > 0 and d.reserved_mb == 10240
    assert "floor_10GiB" not in sglang_need_mb(d)
    assert sum(sglang_need_mb(d).values()) < d.reserved_mb - d.reserve_breakdown["floor_10GiB"]


@pytest.mark.parametrize("profile_mfs", [0.90, 0.92])
def test_what_ran_plans_as_fitting_without_advice_to_go_lower(profile_mfs):
    """The notes' TP8 launch (0.92, decode graphs to bs 128, fp8 KV) and the shipped 0.90."""
    plan = predict(load_record("glm-5-nvfp4"),
        PlanRequest(layout=Layout(tp=8), cuda_graph_max_bs=128,
                   mem_fraction_static=profile_mfs, kv_cache_dtype="fp8_e4m3", **COMMON))
    assert plan.verdict == "fits" and plan.changes == []
    assert plan.max_safe_mfs >= 0.92


def test_a_fraction_that_leaves_too_little_still_warns():
    """0.97 leaves 93.30 x 0.03 = 2.80 GiB after the pool, under the 7.25 GiB SGLang
    allocates there at bs 128: the warning names the figures and the ceiling."""
    plan = predict(load_record("glm-5-nvfp4"),
        PlanRequest(layout=Layout(tp=8), cuda_graph_max_bs=128,
                   mem_fraction_static=0.97, **COMMON))
    assert plan.verdict == "fits" and _warns(plan)
    line = plan.changes[0]
    assert "leaves 2.80 GiB free after the KV pool" in line and "(7.25 GiB:" in line
    assert f"keep mfs <= {plan.max_safe_mfs:.3f}" in line and plan.max_safe_mfs < 0.97
    above = predict(load_record("glm-5-nvfp4"),
        PlanRequest(layout=Layout(tp=8), cuda_graph_max_bs=128,
                    mem_fraction_static=round(plan.max_safe_mfs + 0.002, 3), **COMMON))
    assert _warns(above)


@pytest.mark.parametrize("version", KNOWN_VERSIONS)
def test_the_advice_names_the_versions_own_graph_flag(version):
    """The decode graph flag in the planner's advice is one the version's catalog has (the
    0.5.10.post1 lane has only --cuda-graph-max-bs, 0.5.20+ only the per-phase one)."""
    assert version in available_versions()
    assert load_catalog(version).has_flag(decode_bs_flag(version))
    plan = predict(load_record("glm-5-nvfp4"),
        PlanRequest(layout=Layout(tp=8), cuda_graph_max_bs=128,
                   mem_fraction_static=0.97, version=version, **COMMON))
    assert f"lower {decode_bs_flag(version)} " in plan.changes[0]


def _case(case_id: int) -> dict:
    path = Path(__file__).resolve().parents[2] / "fixtures" / "memory_cases.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return next(r for r in rows if r["id"] == case_id)


def test_starts_that_ran_had_the_need_free_after_their_pool():
    """The need against measured starts: sglang#11716 (case 7, a Llama-70B-class GQA model,
    TP8 on H200, decode graphs to bs 512, SGLang's default 8192-token chunks) logged
    "Memory pool end. avail mem=11.87 GB" and went on to capture; the field notes' GLM-5
    TP8 start had 94 x (1 - 0.92) = 7.52 GB after its pool at bs 128."""
    case = _case(7)
    assert (case["tp_size"], case["cuda_graph_max_bs"]) == (8, 512)
    h200 = memory_defaults(get_gpu("H200").memory_total_mib,
                           MemorySettings(tp=8, decode_max_bs=512))
    assert h200.chunked_prefill_size == 8192
    assert sum(sglang_need_mb(h200).values()) / 1024 <= case["avail_mem_after_mem_pool_gb"]
    glm = memory_defaults(G_PRO6000, MemorySettings(tp=8, use_mla=True, decode_max_bs=128))
    assert sum(sglang_need_mb(glm).values()) / 1024 <= 94 * (1 - 0.92)


ADVICE_FLAG = re.compile(r"(--[a-z][a-z0-9-]*)(?: (?!to )([\w.]+))?")


@pytest.mark.parametrize("version", KNOWN_VERSIONS)
def test_every_flag_the_advice_names_is_in_the_versions_catalog(version):
    """Refused, short of context, above the ceiling, with EP and attention-DP: every flag
    the changes name (with its value) is one the version's catalog from the real wheel
    accepts."""
    catalog, glm = load_catalog(version), load_record("glm-5-nvfp4")
    plans = [
        predict(glm, PlanRequest(layout=Layout(tp=8), mem_fraction_static=m, cuda_graph_max_bs=bs,
                version=version, context_length=ctx, **COMMON))
        for m, bs, ctx in ((0.5, None, None), (0.75, None, 900_000), (0.97, 128, None))]
    plans.append(predict(load_record("deepseek-v3"), PlanRequest(layout=Layout(tp=8, attn_dp=8),
                         mem_fraction_static=0.75, context_length=900_000, version=version,
                         kv_cache_dtype="auto", **COMMON)))
    plans.append(predict(glm, PlanRequest(layout=Layout(tp=8, ep=8, moe_a2a_backend="flashinfer"),
                         mem_fraction_static=0.75, context_length=900_000, version=version,
                         **COMMON)))
    named = [m for p in plans for line in p.changes for m in ADVICE_FLAG.findall(line)]
    assert named
    for flag, value in named:
        option = catalog.option(flag)
        assert option is not None, (version, flag)
        if option.takes_value and value:
            catalog.validate([flag, value])


# --------------------------------------------------------------------------------------
# Planner accuracy against measured SGLang start-ups (tests/fixtures/memory_cases.jsonl).
#
# Run with ``pytest -s`` to see the per-case table (bench/planner_accuracy.py prints the same).


ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures"


@pytest.fixture(scope="module")
def results():
    res = evaluate(FIXTURES / "memory_cases.jsonl", FIXTURES / "memory_cases_inputs.yaml", ROOT)
    print("\n" + format_table(res))
    return res


def test_every_case_is_reported(results):
    ids = [c["id"] for c in load_cases(FIXTURES / "memory_cases.jsonl")]
    assert [r.case_id for r in results] == ids
    for r in results:
        assert r.status == "checked" or r.reason, r.case_id


def test_weights_within_5_percent(results):
    errors = [e for r in results for e in r.errors("weights GiB/GPU")]
    assert errors, "no case with a weights figure was checked"
    assert all(abs(e) <= 0.05 for e in errors), errors


def test_free_after_weights_within_5_percent(results):
    errors = [e for r in results for e in r.errors("free after weights GiB")]
    assert errors
    assert all(abs(e) <= 0.05 for e in errors), errors


def test_kv_tokens_within_10_percent(results):
    errors = [e for r in results for e in r.errors("KV tokens")]
    assert len(errors) >= 3
    assert all(abs(e) <= 0.10 for e in errors), errors


def test_kv_bytes_per_token_within_1_percent(results):
    errors = [e for r in results for e in r.errors("KV B/token")]
    assert len(errors) >= 6
    assert all(abs(e) <= 0.01 for e in errors), errors


def test_excluded_rows_say_why(results):
    for r in results:
        for row in r.rows:
            if row.get("excluded"):
                assert len(row.get("note", "")) > 20
