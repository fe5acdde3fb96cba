"""SGLang 0.5.10.post1's default mem_fraction_static, transcribed from the wheel's
sglang/srt/server_args.py (ServerArgs._handle_gpu_memory_settings, lines 1141-1336; wheel
sha256 a854a68b..., the one gpuserve/data/flags/sglang-0.5.10.post1.json was read from)."""

from __future__ import annotations

import pytest

from gpuserve.cli import main
from gpuserve.memory.memory_defaults import (
    KNOWN_VERSIONS,
    MemorySettings,
    capacity_defaults,
    memory_defaults,
)

V = "0.5.10.post1"
G_PRO6000 = 97887


def test_the_cuda12_lane_has_rules():
    assert V in KNOWN_VERSIONS


@pytest.mark.parametrize(("kwargs", "mfs"), [
    # 512 + 8192*1.5 + 8/8*1024 + 512*2 + MLA piecewise 1536 = 16384 -> (97887-16384)/97887
    (dict(tp=8, use_mla=True), 0.833),
    # attention-DP turns the piecewise graphs off (line 1093): 16384 - 1536 + 512*8*(3+1.5)
    (dict(tp=8, use_mla=True, attn_dp=8), 0.660),
    # EAGLE: piecewise off (line 1090), +4 GiB after the floor (line 1322): R = 18944
    (dict(tp=8, speculative_algorithm="EAGLE"), 0.806),
    (dict(tp=8, speculative_algorithm="STANDALONE"), 0.786),  # +6 GiB (line 1319)
    (dict(tp=8, speculative_algorithm="NGRAM"), 0.848),  # nothing added, piecewise off
    # any a2a backend turns the piecewise graphs off (line 1102); no deepep reserve
    (dict(tp=8, use_mla=True, moe_a2a_backend="deepep"), 0.848),
])
def test_default_fraction(kwargs, mfs):
    assert memory_defaults(G_PRO6000, MemorySettings(version=V, **kwargs)
                           ).mem_fraction_static == mfs


def test_differs_from_0523_where_the_source_does():
    # 20-35 GiB tier: cps 2048, max_bs 24/80 (lines 1173-1185), as 0.5.19
    assert capacity_defaults(32607, 1, V) == (2048, 24)
    assert capacity_defaults(32607, 1, "0.5.23") == (4096, 48)
    # unknown GPU memory: 0.88 (line 1328)
    assert memory_defaults(None, MemorySettings(version=V)).mem_fraction_static == 0.88
    # no --max-running-requests cap on the decode max_bs
    assert memory_defaults(G_PRO6000, MemorySettings(
        tp=8, version=V, max_running_requests=64)).decode_max_bs == 512
    # deepep buffers are reserved from 0.5.19 on, not in 0.5.10.post1
    assert "deepep_buffers" not in memory_defaults(
        G_PRO6000, MemorySettings(tp=8, version=V, moe_a2a_backend="deepep")).reserve_breakdown


def test_plan_accepts_the_version(capsys):
    rc = main(["plan", "--model", "llama-3.1-70b", "--gpus", "8xH200", "--tp", "8",
               "--sglang-version", V])
    assert rc == 0
    assert "SGLang 0.5.10.post1 default" in capsys.readouterr().out
