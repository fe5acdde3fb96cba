"""The planner's "max safe" mem_fraction_static is SGLang's own (G - R) / G, G = memory.total.

Measured against free memory before load (as it once was) it sat below SGLang's own default,
so every default plan warned that CUDA graph capture might OOM.
"""

from __future__ import annotations

import pytest

from gpuserve.memory.memory_defaults import memory_defaults
from gpuserve.memory.models import load_record
from gpuserve.memory.planner import Layout, predict

G_PRO6000 = 97887  # nvidia-smi memory.total of an RTX PRO 6000 (MiB)
COMMON = dict(gpu_memory_mib=G_PRO6000, gpu_count=8, sm_major=12, init_overhead_gib=2.29)


def _warns(plan) -> bool:
    return any("CUDA graph capture may OOM" in c for c in plan.changes)


@pytest.mark.parametrize("max_bs", [None, 128, 256])
def test_sglang_default_fraction_does_not_warn(max_bs):
    glm = load_record("glm-5-nvfp4")
    plan = predict(glm, layout=Layout(tp=8), cuda_graph_max_bs=max_bs, **COMMON)
    d = memory_defaults(G_PRO6000, tp=8, use_mla=True, decode_max_bs=max_bs)
    assert plan.defaults["mem_fraction_is_default"]
    assert plan.mem_fraction_static == d.mem_fraction_static
    assert plan.max_safe_mfs == round((G_PRO6000 - d.reserved_mb) / G_PRO6000, 3)
    assert plan.verdict == "fits" and not _warns(plan)


def test_fraction_above_sglang_ceiling_still_warns():
    glm = load_record("glm-5-nvfp4")
    d = memory_defaults(G_PRO6000, tp=8, use_mla=True, decode_max_bs=128)
    ceiling = (G_PRO6000 - d.reserved_mb) / G_PRO6000  # 0.840 for R = 15616 MiB
    plan = predict(
        glm,
        layout=Layout(tp=8),
        cuda_graph_max_bs=128,
        mem_fraction_static=round(ceiling + 0.01, 3),
        **COMMON,
    )
    assert plan.verdict == "fits" and _warns(plan)
    assert f"keep mfs <= {plan.max_safe_mfs:.3f}" in plan.changes[0]
