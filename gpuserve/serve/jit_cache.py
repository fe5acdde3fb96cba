"""The one persistent directory of JIT and autotune caches on a serving host.

Why: a GLM-5 start spends minutes compiling kernels (FlashInfer, Triton, DeepGEMM,
torch.compile) that a second start can load from disk, if the caches survive. The unit
runs with ``PrivateTmp=yes``, so torch inductor's default (``/tmp/torchinductor_<user>``)
is lost at every restart, and the others land wherever HOME points. Here every cache
gets a fixed place under ``<state_dir>/jit``, rendered into the unit's environment:
shared across switches and SGLang versions where the library's own key covers what
changes with a version, split per SGLang version where it does not. The remove deploy
keeps the directory unless host data ``remove_caches`` is true. Each cache, its variable
and its key: docs/startup.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: the directory under the service's state directory (its HOME)
JIT_DIR = "jit"
_SAFE_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+_-]{0,63}$")


@dataclass(frozen=True)
class Cache:
    """One JIT or autotune cache: the variable that places it, its folder, and whether
    its key is safe to share across versions (``shared``) or it is split per version."""

    variable: str
    folder: str
    shared: bool
    key: str  # what the library keys an entry by, and where that is read


CACHES = (
    Cache("TRITON_CACHE_DIR", "triton", True,
          "sha256 of triton_key() (Triton's version and its compiler's sources), the "
          "kernel source, the backend (ptxas, arch), options and env "
          "(triton/compiler/compiler.py compile())"),
    Cache("TORCHINDUCTOR_CACHE_DIR", "inductor", True,
          "FX graph hash with torch_key() (torch's own sources); default is "
          "tempfile.gettempdir()/torchinductor_<user>, lost under PrivateTmp "
          "(torch/_inductor/runtime/cache_dir_utils.py)"),
    Cache("SGLANG_DG_CACHE_DIR", "deep_gemm", True,
          "kernel.<name>.<digest of name, NVCC version, flags with sm arch, code with "
          "its headers> (DeepGEMM csrc/jit/compiler.hpp); SGLang overwrites "
          "DG_JIT_CACHE_DIR from SGLANG_DG_CACHE_DIR "
          "(sglang srt/layers/deep_gemm_wrapper/compile_utils.py)"),
    Cache("FLASHINFER_WORKSPACE_BASE", "flashinfer", False,
          "<base>/.cache/flashinfer/<sorted CUDA archs>/cached_ops/<op name>: no "
          "FlashInfer version in the path (flashinfer/jit/env.py)"),
    Cache("SGLANG_CACHE_DIR", "sglang", False,
          "SGLang's own disk caches, keyed by their content only "
          "(srt/environ.py; older releases' constrained/disk_cache)"),
)


def jit_dir(state_dir: str) -> str:
    """The host's JIT cache directory (inside the service's writable state directory)."""
    return f"{state_dir.rstrip('/')}/{JIT_DIR}"


def version_folder(sglang_version: str) -> str:
    """The per-version folder's name; a version that is not a plain release name gets
    one folder of its own rather than a path built from it."""
    if _SAFE_VERSION.match(sglang_version or ""):
        return f"sglang-{sglang_version}"
    return "sglang-other"


def jit_env(state_dir: str, sglang_version: str) -> list[tuple[str, str]]:
    """The unit's ``Environment=`` pairs that place every cache of :data:`CACHES`."""
    root = jit_dir(state_dir)
    split = f"{root}/{version_folder(sglang_version)}"
    return [(c.variable, f"{root if c.shared else split}/{c.folder}") for c in CACHES]
