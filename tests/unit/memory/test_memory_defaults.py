"""Differential test: gpuserve.memory.memory_defaults against SGLang's handle_gpu_memory_settings.

The real function (vendored verbatim from the 0.5.23 and 0.5.19 wheels under
tests/fixtures/sglang/, see SOURCE.md there) runs with its SGLang imports replaced by stubs,
so no torch is needed. Every grid point must give the same chunked_prefill_size, decode
max_bs and mem_fraction_static.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import itertools
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuserve.cli import main
from gpuserve.memory.memory_defaults import (
    KNOWN_VERSIONS,
    MemorySettings,
    capacity_defaults,
    memory_defaults,
)

VENDORED = Path(__file__).resolve().parents[2] / "fixtures" / "sglang"


class Phase:
    DECODE = "decode"
    PREFILL = "prefill"


class Backend:
    FULL = "full"
    BREAKABLE = "breakable"
    DISABLED = "disabled"


@dataclass
class PhaseConfig:
    backend: str
    max_bs: int | None = None
    bs: list[int] | None = None


@dataclass
class CudaGraphConfig:
    decode: PhaseConfig = field(default_factory=lambda: PhaseConfig(Backend.FULL))
    prefill: PhaseConfig = field(default_factory=lambda: PhaseConfig(Backend.BREAKABLE))


class Args(types.SimpleNamespace):
    pass


_STATE: dict = {}


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__path__ = []  # packages too
    mod.__dict__.update(attrs)
    return mod


def _load_sglang(version: str, monkeypatch) -> types.ModuleType:
    view = lambda sa: sa  # noqa: E731 - the stubs return the args object itself

    def declare_resolution(sa, _name, **kw):
        for k, v in kw.items():
            setattr(sa, k, v)

    stubs = {
        "sglang": _module("sglang"),
        "sglang.srt": _module("sglang.srt"),
        "sglang.srt.arg_groups": _module("sglang.srt.arg_groups"),
        "sglang.srt.arg_groups.overrides": _module(
            "sglang.srt.arg_groups.overrides",
            declare_resolution=declare_resolution,
            model_config_of=lambda sa: types.SimpleNamespace(is_multimodal=False),
            post_capture_kv_sizing_planned=lambda sa: False,
            resolved_view=view,
            resolving_view=view,
            use_mla_backend=lambda sa: sa._use_mla,
        ),
        "sglang.srt.environ": _module("sglang.srt.environ", envs=None),
        "sglang.srt.model_executor": _module("sglang.srt.model_executor"),
        "sglang.srt.model_executor.cuda_graph_config": _module(
            "sglang.srt.model_executor.cuda_graph_config", Backend=Backend, Phase=Phase
        ),
        "sglang.srt.runtime_context": _module(
            "sglang.srt.runtime_context",
            attn_dp_enabled_of=lambda sa: sa.attn_dp_size > 1,
            get_platform=lambda: types.SimpleNamespace(is_xpu=False),
        ),
        "sglang.srt.utils": _module("sglang.srt.utils"),
        "sglang.srt.utils.common": _module(
            "sglang.srt.utils.common", get_device_memory_capacity=lambda device: _STATE["gpu"]
        ),
        "sglang.srt.arg_groups.model_overrides": _module("sglang.srt.arg_groups.model_overrides"),
        "sglang.srt.arg_groups.model_overrides.qwen3_vl": _module(
            "sglang.srt.arg_groups.model_overrides.qwen3_vl",
            expand_multimodal_decode_graph_to_running_limit=lambda *a: None,
        ),
    }
    for name, mod in stubs.items():
        monkeypatch.setitem(sys.modules, name, mod)
    # The vendored files end in .py.src so linters leave SGLang's code style alone.
    for file, name in (
        ("cuda_graph_hook_excerpt.py.src", "sglang.srt.arg_groups.cuda_graph_hook"),
        ("memory_hook.py.src", f"_sglang_memory_hook_{version}"),
    ):
        path = str(VENDORED / version / file)
        loader = importlib.machinery.SourceFileLoader(name, path)
        spec = importlib.util.spec_from_file_location(name, path, loader=loader)
        mod = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, mod)
        spec.loader.exec_module(mod)
    return mod


def _sglang_defaults(hook, version, gpu, *, tp, attn_dp, use_mla, max_bs, mrr, a2a, cps):
    _STATE["gpu"] = gpu
    sa = Args(
        device="cuda",
        cuda_graph_config=CudaGraphConfig(),
        chunked_prefill_size=cps,
        tp_size=tp,
        pp_size=1,
        max_running_requests=mrr,
        torch_compile_max_bs=None,
        max_total_tokens=None,
        model_path="org/model",
        mem_fraction_static=None,
        language_only=False,
        language_model_only=False,
        disaggregation_mode="null",
        max_prefill_tokens=16384,
        speculative_num_draft_tokens=None,
        enable_symm_mem=False,
        attn_dp_size=attn_dp,
        dp_size=attn_dp,
        enable_dp_attention=attn_dp > 1,
        disable_cuda_graph_padding=False,
        speculative_algorithm=None,
        moe_a2a_backend=a2a,
        _use_mla=use_mla,
        _cuda_graph_config_locked=set(),
    )
    sa.cuda_graph_config.decode.max_bs = max_bs
    if version == "0.5.19":
        hook.handle_gpu_memory_settings(sa, gpu)
    else:
        hook.handle_gpu_memory_settings(sa)
    return sa.chunked_prefill_size, sa.cuda_graph_config.decode.max_bs, sa.mem_fraction_static


GPUS = [16000, 24576, 32607, 46068, 49140, 81559, 97887, 143771, 183359, None]
GRID = [
    (tp, attn_dp, mla, bs, mrr, a2a, cps)
    for tp, attn_dp in [(1, 1), (2, 1), (4, 1), (4, 4), (8, 1), (8, 2), (8, 8)]
    for mla, bs, mrr, a2a, cps in itertools.product(
        (True, False), (None, 128), (None, 48), ("none", "deepep"), (None, 2048, -1)
    )
]


@pytest.mark.parametrize("version", ["0.5.23", "0.5.19"])
def test_memory_defaults_match_sglang(version, monkeypatch):
    hook = _load_sglang(version, monkeypatch)
    mismatches = []
    for gpu in GPUS:
        for tp, attn_dp, mla, bs, mrr, a2a, cps in GRID:
            want = _sglang_defaults(
                hook,
                version,
                gpu,
                tp=tp,
                attn_dp=attn_dp,
                use_mla=mla,
                max_bs=bs,
                mrr=mrr,
                a2a=a2a,
                cps=cps,
            )
            got = memory_defaults(
                gpu,
                MemorySettings(tp=tp,
                attn_dp=attn_dp,
                use_mla=mla,
                version=version,
                decode_max_bs=bs,
                max_running_requests=mrr,
                moe_a2a_backend=a2a,
                chunked_prefill_size=cps),
            )
            have = (got.chunked_prefill_size, got.decode_max_bs, got.mem_fraction_static)
            if have != want:
                mismatches.append((gpu, tp, attn_dp, mla, bs, mrr, a2a, cps, want, have))
    assert not mismatches, mismatches[:10]
    assert len(GPUS) * len(GRID) == 3360  # grid points compared per version


# --------------------------------------------------------------------------------------
# SGLang 0.5.10.post1's default mem_fraction_static, transcribed from the wheel's
# sglang/srt/server_args.py (ServerArgs._handle_gpu_memory_settings, lines 1141-1336; wheel sha256
# a854a68b..., the one gpuserve/data/flags/sglang-0.5.10.post1.json was read from).


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
    settings = MemorySettings(version=V, **kwargs)
    assert memory_defaults(G_PRO6000, settings).mem_fraction_static == mfs


def test_differs_from_0523_where_the_source_does():
    # 20-35 GiB tier: cps 2048, max_bs 24/80 (lines 1173-1185), as 0.5.19
    assert capacity_defaults(32607, 1, V) == (2048, 24)
    assert capacity_defaults(32607, 1, "0.5.23") == (4096, 48)
    # unknown GPU memory: 0.88 (line 1328)
    assert memory_defaults(None, MemorySettings(version=V)).mem_fraction_static == 0.88
    # no --max-running-requests cap on the decode max_bs
    capped = MemorySettings(tp=8, version=V, max_running_requests=64)
    assert memory_defaults(G_PRO6000, capped).decode_max_bs == 512
    # deepep buffers are reserved from 0.5.19 on, not in 0.5.10.post1
    assert "deepep_buffers" not in memory_defaults(
        G_PRO6000, MemorySettings(tp=8, version=V, moe_a2a_backend="deepep")).reserve_breakdown


def test_plan_accepts_the_version(capsys):
    rc = main(["plan", "--model", "llama-3.1-70b", "--gpus", "8xH200", "--tp", "8",
               "--sglang-version", V])
    assert rc == 0
    assert "SGLang 0.5.10.post1 default" in capsys.readouterr().out
