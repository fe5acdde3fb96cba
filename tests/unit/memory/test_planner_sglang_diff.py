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

from gpuserve.memory.memory_defaults import MemorySettings, memory_defaults

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
