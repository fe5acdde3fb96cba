"""The stand-in's kernel JIT cache (lab/sglang_standin/src/sglang/_standin/jit.py): built
once per key under FLASHINFER_WORKSPACE_BASE, reused by the next start of the same
launch, not shared by another key; its lines give the start record's JIT phase."""

from __future__ import annotations

import os
import subprocess
import sys

from gpuserve.measure.start_phases import phases

CODE = ("import sys; from sglang._standin import jit; "
        "jit.load_op(sys.argv[1], 'GlmMoeDsaForCausalLM')")


def _start(site, base, kv_dtype: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(site), "FLASHINFER_WORKSPACE_BASE": str(base),
           "GPUSERVE_LAB_STANDIN_JIT_SECONDS": "0.2", "FLASHINFER_CUDA_ARCH_LIST": "12.0f"}
    out = subprocess.run([sys.executable, "-c", CODE, kv_dtype], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stderr


def test_second_start_reuses_the_op_another_key_does_not(site23, tmp_path) -> None:
    first = _start(site23, tmp_path, "fp8_e4m3")
    built = list(tmp_path.rglob("*.so"))
    assert len(built) == 1 and "JIT cache miss" in first
    assert built[0].parts[-5:-2] == ("flashinfer", "120", "cached_ops")
    assert "jit" in phases(first)  # FlashInfer's Loading/Finished pair, stamped
    second = _start(site23, tmp_path, "fp8_e4m3")
    assert "JIT cache hit" in second and list(tmp_path.rglob("*.so")) == built
    other = _start(site23, tmp_path, "bf16")
    assert "JIT cache miss" in other and len(list(tmp_path.rglob("*.so"))) == 2


def test_without_a_cache_directory_nothing_is_written(site23, tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "FLASHINFER_WORKSPACE_BASE"}
    env.update(PYTHONPATH=str(site23), HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", CODE, "auto"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "JIT" not in out.stderr and not list(tmp_path.rglob("*"))
