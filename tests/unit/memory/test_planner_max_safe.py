"""The planner's "max safe" mem_fraction_static: the highest fraction whose memory outside
the static pool (pre x (1 - m), what stays free after SGLang sizes the KV pool) still holds
what SGLang allocates there at the launch's graph size and chunk size.

It used to be SGLang's own default, whose reserve is a default-choosing heuristic (1.5 MiB
per chunked-prefill token, a 10 GiB floor on large cards): "keep mfs <= 0.840" on every
shipped GLM-5 profile, although the field notes ran TP8 at 0.92 with decode graphs to bs 128
(7.52 GiB free after the pool) and a public guide ran 0.92 on the same GPUs (7.43-7.53 GB).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from gpuserve.host.gpus import get_gpu
from gpuserve.launch.catalog import available_versions, load_catalog
from gpuserve.memory.memory_defaults import KNOWN_VERSIONS, MemorySettings, memory_defaults
from gpuserve.memory.models import load_record
from gpuserve.memory.planner import (
    ACTIVATION_MIB_PER_TOKEN,
    Layout,
    PlanRequest,
    decode_bs_flag,
    predict,
    sglang_need_mb,
)

G_PRO6000 = 97887  # nvidia-smi memory.total of an RTX PRO 6000 (MiB)
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
