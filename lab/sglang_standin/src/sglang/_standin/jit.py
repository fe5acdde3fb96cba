"""The stand-in's kernel JIT: one FlashInfer op per start, compiled once and then loaded
from the cache directory, so a second start of the same launch is faster.

COMPOSED: no kernel is built; the "compiled" op is a small text file. What is kept from
FlashInfer is where the file lives and what keys it (flashinfer/jit/env.py:
``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<sorted CUDA archs>/cached_ops/<op name>``,
the op name carrying the dtypes it was generated for) and its log lines
(flashinfer/jit/core.py: "Loading JIT ops: <name>", "Finished loading JIT ops: <name>",
Python logging's ``%(asctime)s - %(levelname)s - %(name)s: %(message)s``). A stand-in
line says whether the op was built or reused.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from sglang._standin import logs
from sglang._standin.sim import env_float


def _flashinfer_log(message: str) -> None:
    now = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    sys.stderr.write(f"{stamp},{int(now % 1 * 1000):03d} - INFO - flashinfer.jit: {message}\n")
    sys.stderr.flush()


def op_path(kv_dtype: str, architecture: str) -> Path | None:
    """The cached op of this launch (FlashInfer's layout and key, see the docstring);
    None without FLASHINFER_WORKSPACE_BASE (the stand-in writes nowhere it was not told)."""
    if not os.environ.get("FLASHINFER_WORKSPACE_BASE"):
        return None
    base = Path(os.environ["FLASHINFER_WORKSPACE_BASE"])
    archs = os.environ.get("FLASHINFER_CUDA_ARCH_LIST") or "12.0"
    arch = "_".join(sorted(a.replace(".", "").rstrip("af") for a in archs.split()))
    name = f"batch_decode_{architecture.lower()}_dtype_kv_{kv_dtype or 'auto'}"
    return base / ".cache" / "flashinfer" / arch / "cached_ops" / name / f"{name}.so"


def load_op(kv_dtype: str, architecture: str) -> None:
    """Load the op, building it first (GPUSERVE_LAB_STANDIN_JIT_SECONDS, by default half
    of LOAD_SECONDS) when the cache does not have it."""
    path = op_path(kv_dtype, architecture)
    if path is None:
        return
    name = path.parent.name
    _flashinfer_log(f"Loading JIT ops: {name}")
    if path.is_file():
        logs.log(f"sglang lab stand-in (composed): JIT cache hit {path}")
    else:
        time.sleep(env_float("JIT_SECONDS", env_float("LOAD_SECONDS", 1.0) * 0.5))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"composed by the sglang lab stand-in: {name}\n")
            logs.log(f"sglang lab stand-in (composed): JIT cache miss, built {path}")
        except OSError as e:
            logs.log(f"sglang lab stand-in (composed): JIT cache not writable: {e}")
    _flashinfer_log(f"Finished loading JIT ops: {name}")
