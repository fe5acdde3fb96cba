"""The memory plan of each PD role, against SGLang's own PD memory code.

SOURCE: sglang 0.5.23 wheel (PyPI sha256 00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b
77bc9db9d859937), sglang/srt/arg_groups/memory_hook.py:
  - handle_gpu_memory_settings, lines 298-305: a decode server's activation tokens are
    max((max_running_requests or decode max_bs or 1) x (speculative_num_draft_tokens or
    1), 2048); every other server's max(chunked_prefill_size, 2048);
  - reserve_for_graph_mb: decode graphs (2 x max_bs) and attention-DP padding only when
    disaggregation_mode != "prefill"; prefill graphs (MLA: 1.5 GiB; +1 GiB breakable with
    deepep) only when != "decode";
  - reserve_for_deepep_a2a_mb: deepep's 2 GiB only when != "prefill".
The 0.5.19 wheel has the same rules (memory_hook.py lines 239-246).
Expected reserves below are that arithmetic written out, term by term.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuserve.fleet.disaggregation import role_profile
from gpuserve.launch.profiles import load_profile
from gpuserve.memory.memory_defaults import MemorySettings, memory_defaults
from gpuserve.memory.preflight import check_fit, launch_settings
from tests.checkpoints import scan_once

REPO = Path(__file__).resolve().parents[3]
BOX = json.loads((REPO / "tests/fixtures/hostfacts/reference-box-kvm.json").read_text())
GPUS = BOX["gpus"]  # 8x RTX PRO 6000 Blackwell Server Edition, 97887 MiB
G = 97887


def sglang_reserve(mode: str, *, cps=8192, max_bs=512, running=None, draft=None,
                   attn_dp=1, tp=8, mla=True, deepep=False) -> float:
    """memory_hook.py's reserved_mem for one server, term by term (lines cited above)."""
    if mode == "decode":
        activation = max((running or max_bs or 1) * (draft or 1), 2048)
    else:
        activation = max(cps, 2048)
    reserved = 512 + activation * 1.5 + tp / 8 * 1024
    graphs = 0.0
    if mode != "prefill":
        graphs += max_bs * 2
        if attn_dp > 1:
            graphs += max_bs * attn_dp * 3 + (max_bs * attn_dp * 1.5 if max_bs > 300 else 0)
    if mode != "decode":
        graphs += 1.5 * 1024 if mla else 0
        graphs += 1024 if deepep else 0  # breakable prefill graphs with deepep (default)
    reserved = max(reserved + graphs, 10 * 1024)  # G > 60 GiB
    return reserved + (2048 if deepep and mode != "prefill" else 0)


@pytest.mark.parametrize("case", [
    {}, {"attn_dp": 8}, {"running": 1024, "draft": 4}, {"deepep": True},
])
@pytest.mark.parametrize("mode", ["null", "prefill", "decode"])
def test_each_roles_reserve_is_sglangs(mode, case) -> None:
    d = memory_defaults(G, MemorySettings(
        tp=8, use_mla=True, version="0.5.23", disaggregation_mode=mode,
        attn_dp=case.get("attn_dp", 1), max_running_requests=case.get("running"),
        num_draft_tokens=case.get("draft"),
        moe_a2a_backend="deepep" if case.get("deepep") else "none"))
    # max_running_requests caps the decode max_bs in 0.5.23 (1024 > 512: no cap here)
    want = sglang_reserve(mode, **case)
    assert d.reserved_mb == pytest.approx(want)
    assert d.mem_fraction_static == round((G - want) / G, 3)


def test_decode_keeps_more_for_its_pool_than_prefill() -> None:
    modes = {m: memory_defaults(G, MemorySettings(tp=8, use_mla=True, disaggregation_mode=m))
             for m in ("null", "prefill", "decode")}
    # the plain launch is sglang.md's worked TP8 MLA value: R 16,384 MiB, mfs 0.833
    assert modes["null"].reserved_mb == 16384 and modes["null"].mem_fraction_static == 0.833
    assert modes["decode"].mem_fraction_static > modes["prefill"].mem_fraction_static
    assert modes["prefill"].mem_fraction_static > modes["null"].mem_fraction_static


@pytest.fixture(scope="module")
def glm5():
    return scan_once("glm-5-nvfp4", shards=20)


def _pd(tmp_path: Path, roles: str) -> object:
    path = tmp_path / "pd.yaml"
    path.write_text(f"extends: {REPO / 'profiles/glm5-nvfp4-tp8.yaml'}\n"
                    "memory:\n  mem_fraction_static: auto\n"
                    f"disaggregation:\n  transfer_backend: mooncake\n{roles}")
    return load_profile(path)


def test_each_role_is_planned_with_its_own_reserve(glm5, tmp_path) -> None:
    profile = _pd(tmp_path, "  decode:\n    memory:\n      cuda_graph_max_bs: 256\n")
    fits = {r: check_fit(role_profile(profile, r), glm5, GPUS, "0.5.23")
            for r in ("prefill", "decode")}
    for role, fit in fits.items():
        assert launch_settings(role_profile(profile, role)).layout.disaggregation_mode == role
        assert fit.ok, fit.message
    prefill, decode = fits["prefill"].plan, fits["decode"].plan
    # SGLang's own fraction per role: the decode server reserves no prefill graphs and
    # sizes its activations by its batch, so its KV pool is the larger one
    assert prefill.mem_fraction_static == round((G - sglang_reserve("prefill", max_bs=128))
                                                / G, 3)
    assert decode.mem_fraction_static == round((G - sglang_reserve(
        "decode", max_bs=256)) / G, 3)
    assert decode.kv_tokens > prefill.kv_tokens


def test_the_preflight_refuses_the_role_that_does_not_fit(glm5, tmp_path) -> None:
    profile = _pd(tmp_path, "  prefill:\n    memory:\n      mem_fraction_static: 0.55\n")
    prefill = check_fit(role_profile(profile, "prefill"), glm5, GPUS, "0.5.23")
    decode = check_fit(role_profile(profile, "decode"), glm5, GPUS, "0.5.23")
    assert decode.ok and not prefill.ok
    assert prefill.message.startswith("profile pd does not fit")
    assert "memory.mem_fraction_static 0.550" in prefill.message
