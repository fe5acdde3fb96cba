"""The simulated GPU box and SGLang's own start-up memory arithmetic.

Everything here follows the SGLang source of the version the stand-in mimics
(paths relative to the sglang package of the 0.5.23 wheel):

- default chunked_prefill_size / decode max_bs / mem_fraction_static:
  srt/arg_groups/memory_hook.py::handle_gpu_memory_settings and reserve_for_graph_mb;
  capture sizes from srt/arg_groups/cuda_graph_hook.py;
- KV budget ``rest = avail_after_weights - pre * (1 - mfs)`` and its ValueError:
  srt/mem_cache/kv_cache_configurator.py::_profile_available_bytes;
- token capacity: srt/model_executor/pool_configurator.py (cell size for GQA:
  kv_heads/attn_tp * (head_dim + v_head_dim) * layers * dtype bytes) and the
  "Not enough memory" RuntimeError of MemoryPoolConfig.__post_init__;
- max_running_requests: kv_cache_configurator.py::resolve_max_num_reqs.

The simulated hardware comes from GPUSERVE_LAB_STANDIN_* variables (README.md).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

GB = 1 << 30

ENV_PREFIX = "GPUSERVE_LAB_STANDIN_"


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(ENV_PREFIX + name)
    if raw is None or raw == "":
        return default
    return float(raw)


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(ENV_PREFIX + name, default)


class StartupError(Exception):
    """An exception SGLang's scheduler would raise while starting (message verbatim)."""

    def __init__(self, exc_type: str, message: str, frames: list[tuple[str, int, str]]):
        super().__init__(message)
        self.exc_type = exc_type
        self.message = message
        self.frames = frames


# SGLang's text (srt/model_executor/runner_backend_utils/__init__.py, 0.5.19 and 0.5.23).
CUDA_GRAPH_CAPTURE_FAILED_MSG = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
    "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. "
    "(Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)


def decode_capture_sizes(max_bs: int, speculative: bool = False) -> list[int]:
    """srt/arg_groups/cuda_graph_hook.py::generate_decode_cuda_graph_batch_sizes."""
    if not speculative:
        sizes = ([1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16))
                 + list(range(512, max_bs + 1, 32)))
    else:
        sizes = (list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4))
                 + list(range(72, 257, 8)) + list(range(272, max_bs + 1, 16)))
    sizes = [s for s in sizes if s <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    return sizes


def prefill_capture_sizes(max_bs: int) -> list[int]:
    """srt/arg_groups/cuda_graph_hook.py::generate_prefill_cuda_graph_batch_sizes."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
             + list(range(576, 1025, 64)) + list(range(1280, 4097, 256))
             + list(range(4608, max_bs + 1, 512)))
    return [s for s in sizes if s <= max_bs]


@dataclass
class ModelShape:
    """What the stand-in needs of a model: read from <model_path>/config.json if present."""

    architecture: str = "Qwen3ForCausalLM"
    model_type: str = "qwen3"
    num_layers: int = 28
    num_kv_heads: int = 8
    head_dim: int = 128
    context_len: int = 40960
    is_mla: bool = False
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64

    @classmethod
    def from_model_path(cls, model_path: str) -> ModelShape:
        cfg_file = Path(model_path) / "config.json"
        try:
            cfg = json.loads(cfg_file.read_text())
        except (OSError, ValueError):
            return cls()
        return cls.from_config(cfg)

    @classmethod
    def from_config(cls, cfg: dict) -> ModelShape:
        """The shape from config.json keys (a surface's ``model:`` uses the same keys)."""
        shape = cls()
        archs = cfg.get("architectures") or [shape.architecture]
        shape.architecture = archs[0]
        shape.model_type = cfg.get("model_type", shape.model_type)
        shape.num_layers = int(cfg.get("num_hidden_layers", shape.num_layers))
        heads = int(cfg.get("num_attention_heads", 32))
        shape.num_kv_heads = int(cfg.get("num_key_value_heads") or heads)
        shape.head_dim = int(cfg.get("head_dim") or cfg.get("hidden_size", 4096) // heads)
        shape.context_len = int(cfg.get("max_position_embeddings", shape.context_len))
        if cfg.get("kv_lora_rank"):
            shape.is_mla = True
            shape.kv_lora_rank = int(cfg["kv_lora_rank"])
            shape.qk_rope_head_dim = int(cfg.get("qk_rope_head_dim", 64))
        return shape


def _dtype_bytes(kv_cache_dtype: str) -> tuple[int | float, str]:
    if kv_cache_dtype in ("fp8_e4m3", "fp8_e5m2", "mxfp8"):
        name = "torch.float8_e5m2" if kv_cache_dtype == "fp8_e5m2" else "torch.float8_e4m3fn"
        return 1, name
    if kv_cache_dtype in ("nvfp4", "fp4_mx_block16"):
        return 0.5, "torch.float4_e2m1fn_x2"
    return 2, "torch.bfloat16"


@dataclass
class Box:
    """The simulated card: size, what is resident before weights, weights per GPU, and
    what a captured decode batch size costs (MiB; SGLang reserves 2, capture uses 60%)."""

    gpu_mem_mib: float = 97887.0
    init_gb: float = 1.6
    weights_gb: float = 1.5
    decode_graph_mb_per_bs: float = 1.2

    @classmethod
    def from_env(cls) -> Box:
        return cls(gpu_mem_mib=env_float("GPU_MEM_MIB", 97887.0),
                   init_gb=env_float("INIT_GB", 1.6), weights_gb=env_float("WEIGHTS_GB", 1.5))


@dataclass
class Plan:
    """The resolved start-up figures, in the order SGLang computes and logs them."""

    gpu_mem_mib: float
    world: int
    tp: int
    mem_fraction_static: float
    mfs_auto: bool
    chunked_prefill_size: int
    decode_max_bs: int
    decode_graphs: bool
    prefill_graphs: bool
    decode_bs: list[int]
    prefill_bs: list[int]
    pre_gb: float
    weights_gb: float
    after_weights_gb: float
    kv_dtype_name: str
    cell_bytes: float
    is_mla: bool
    max_total_num_tokens: int = 0
    kv_gb: float = 0.0
    after_pool_gb: float = 0.0
    decode_graph_gb: float = 0.0
    prefill_graph_gb: float = 0.0
    after_graphs_gb: float = 0.0
    max_running_requests: int = 0
    context_len: int = 0
    max_prefill_tokens: int = 16384
    dp: int = 1
    attn_dp: int = 1
    load_failed: bool = False   # the weights alone do not fit: OOM while loading
    errors: list[StartupError] = field(default_factory=list)


def plan(args, shape: ModelShape, box: Box | None = None) -> Plan:
    """Resolve SGLang's memory settings for ``args`` on the simulated box (the
    GPUSERVE_LAB_STANDIN_* knobs unless a surface gives ``box``)."""
    box = box or Box.from_env()
    gpu_mem = box.gpu_mem_mib
    tp = int(args.tp_size or 1)
    pp = int(getattr(args, "pp_size", 1) or 1)
    dp = int(getattr(args, "dp_size", 1) or 1)
    attn_dp = int(getattr(args, "attn_dp_size", 1) or 1)
    if getattr(args, "enable_dp_attention", False) and attn_dp == 1 and dp > 1:
        # parallel_hook.py::handle_deprecated_dp_attention
        attn_dp, dp = dp, 1
    world = tp * pp * dp

    graph_cfg = getattr(args, "cuda_graph_config", None) or {}
    decode_cfg = dict(graph_cfg.get("decode", {}))
    prefill_cfg = dict(graph_cfg.get("prefill", {}))
    decode_backend = decode_cfg.get("backend") or getattr(args, "cuda_graph_backend_decode",
                                                          None) or "full"
    prefill_backend = prefill_cfg.get("backend") or getattr(
        args, "cuda_graph_backend_prefill", None) or "breakable"
    if getattr(args, "disable_cuda_graph", False):
        decode_backend = prefill_backend = "disabled"
    if getattr(args, "disable_decode_cuda_graph", False):
        decode_backend = "disabled"
    if getattr(args, "disable_prefill_cuda_graph", False):
        prefill_backend = "disabled"

    # memory_hook.py::handle_gpu_memory_settings (gpu_mem is in MiB there too).
    cps = args.chunked_prefill_size
    max_bs = decode_cfg.get("max_bs") or getattr(args, "cuda_graph_max_bs_decode", None)
    max_bs_is_default = max_bs is None
    if gpu_mem < 20 * 1024:
        d_cps, d_bs = 2048, 8
    elif gpu_mem < 35 * 1024:
        d_cps, d_bs = 4096, (48 if tp < 4 else 160)
    elif gpu_mem < 60 * 1024:
        d_cps, d_bs = 4096, (32 if tp < 4 else 160)
    elif gpu_mem < 160 * 1024:
        d_cps, d_bs = 8192, (256 if tp < 4 else 512)
    else:
        d_cps, d_bs = 16384, 512
    cps = d_cps if cps is None else int(cps)
    max_bs = d_bs if max_bs is None else int(max_bs)
    if (max_bs_is_default and args.max_running_requests is not None
            and max_bs > args.max_running_requests):
        max_bs = int(args.max_running_requests)
    speculative = bool(getattr(args, "speculative_algorithm", None))
    decode_bs = decode_capture_sizes(max_bs, speculative)
    user_decode_bs = decode_cfg.get("bs") or getattr(args, "cuda_graph_bs_decode", None)
    if user_decode_bs:
        decode_bs = list(user_decode_bs)
        max_bs = max(decode_bs)
    prefill_max = prefill_cfg.get("max_bs") or getattr(args, "cuda_graph_max_bs_prefill", None)
    if prefill_max is None:
        prefill_max = cps if not shape.is_mla else min(8192, cps)
    prefill_bs = prefill_capture_sizes(int(prefill_max))
    mfs = args.mem_fraction_static
    mfs_auto = mfs is None
    if mfs_auto:
        max_prefill = int(getattr(args, "max_prefill_tokens", 16384) or 16384)
        activation = max(cps, 2048) if cps > 0 else max(max_prefill, 2048)
        reserved = 512 + activation * 1.5 + tp * pp / 8 * 1024
        graph = 0.0
        if decode_backend != "disabled":
            graph += max_bs * 2
        if attn_dp > 1:
            graph += max_bs * attn_dp * 3
            if max_bs > 300:
                graph += max_bs * attn_dp * 1.5
        if prefill_backend != "disabled":
            graph += 1.5 * 1024 if shape.is_mla else len(prefill_bs) * 8
        reserved += graph
        if gpu_mem > 60 * 1024:
            reserved = max(reserved, 10 * 1024)
        mfs = round((gpu_mem - reserved) / gpu_mem, 3)
    mfs = float(mfs)

    if attn_dp > 1 and cps > 0:
        cps = cps // attn_dp  # parallel_hook.py divides it after the memory hook ran

    # The box: free memory before weights (CUDA context and NCCL already resident).
    pre = gpu_mem / 1024 - box.init_gb
    weights = box.weights_gb
    after_weights = pre - weights

    e, dtype_name = _dtype_bytes(getattr(args, "kv_cache_dtype", "auto") or "auto")
    attn_tp = max(1, tp // attn_dp)
    if shape.is_mla:
        cell = (shape.kv_lora_rank + shape.qk_rope_head_dim) * shape.num_layers * e
    else:
        cell = max(1, shape.num_kv_heads // attn_tp) * (2 * shape.head_dim) \
            * shape.num_layers * e
    ctx = args.context_length or shape.context_len
    p = Plan(gpu_mem_mib=gpu_mem, world=world, tp=tp, mem_fraction_static=mfs,
             mfs_auto=mfs_auto, chunked_prefill_size=cps, decode_max_bs=max_bs,
             decode_graphs=decode_backend != "disabled",
             prefill_graphs=prefill_backend != "disabled", decode_bs=decode_bs,
             prefill_bs=prefill_bs, pre_gb=pre, weights_gb=weights,
             after_weights_gb=after_weights, kv_dtype_name=dtype_name, cell_bytes=cell,
             is_mla=shape.is_mla, context_len=int(ctx),
             max_prefill_tokens=int(getattr(args, "max_prefill_tokens", 16384) or 16384),
             dp=dp, attn_dp=attn_dp)
    if after_weights <= 0:
        p.load_failed = True
        p.errors.append(load_oom(p))
        return p

    # kv_cache_configurator.py::_profile_available_bytes
    rest = after_weights - pre * (1 - mfs)
    if rest <= 0:
        minimum = 1 - after_weights / pre
        suggested = math.ceil(minimum * 1000) / 1000
        p.errors.append(StartupError(
            "ValueError",
            f"Loaded weights leave no GPU memory for the KV cache under "
            f"--mem-fraction-static={mfs}. "
            f"Raise --mem-fraction-static above {suggested:.3f} "
            f"(minimum viable = 1 - available/pre = {minimum:.4f}). If using speculative "
            f"decoding, draft weights are now counted.",
            [("sglang/srt/mem_cache/kv_cache_configurator.py", 3051,
              "_profile_available_bytes")]))
        return p
    page = int(getattr(args, "page_size", None) or 1)
    tokens = int(rest * GB // cell)
    tokens = tokens // page * page
    if args.max_total_tokens is not None:
        tokens = min(tokens, int(args.max_total_tokens))
    if tokens <= 0:
        p.errors.append(StartupError(
            "RuntimeError",
            "Not enough memory. Please try to increase --mem-fraction-static. "
            f"Current value: mem_fraction_static={mfs}",
            [("sglang/srt/model_executor/pool_configurator.py", 98, "__post_init__")]))
        return p
    p.max_total_num_tokens = tokens
    p.kv_gb = tokens * cell / GB
    p.after_pool_gb = after_weights - p.kv_gb

    # Graph capture lives in the (1 - mfs) slack; SGLang's reserve is an estimate,
    # the simulated capture uses 60% of it.
    p.decode_graph_gb = (max_bs * box.decode_graph_mb_per_bs / 1024) if p.decode_graphs \
        else 0.0
    p.prefill_graph_gb = ((1.5 * 1024 if shape.is_mla else len(prefill_bs) * 8) * 0.6 / 1024
                          if p.prefill_graphs else 0.0)
    p.after_graphs_gb = p.after_pool_gb - p.decode_graph_gb - p.prefill_graph_gb

    mrr_est = max(min(int(tokens / p.context_len * 512), 4096), 2048)
    if args.max_running_requests is not None:
        p.max_running_requests = min(max(1, int(args.max_running_requests) // attn_dp),
                                     tokens // 2)
    else:
        p.max_running_requests = min(mrr_est, tokens // 2)
    return p


def capture_oom(p: Plan, tried_gb: float, avail_gb: float) -> StartupError:
    """torch's CUDA OOM text (c10/cuda/CUDACachingAllocator.cpp) wrapped as SGLang does
    (srt/model_executor/runner/decode_cuda_graph_runner.py)."""
    total = p.gpu_mem_mib / 1024
    in_use = total - max(avail_gb, 0.0)
    oom = (
        f"CUDA out of memory. Tried to allocate {tried_gb:.2f} GiB. GPU 0 has a total "
        f"capacity of {total:.2f} GiB of which {max(avail_gb, 0.0) * 1024:.2f} MiB is free. "
        f"Including non-PyTorch memory, this process has {in_use:.2f} GiB memory in use. "
        f"Of the allocated memory {in_use - 0.5:.2f} GiB is allocated by PyTorch, and "
        f"{0.31:.2f} GiB is reserved by PyTorch but unallocated. If reserved but unallocated "
        "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to "
        "avoid fragmentation.  See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )
    return StartupError(
        "Exception",
        f"Capture cuda graph failed: {oom}\n{CUDA_GRAPH_CAPTURE_FAILED_MSG}",
        [("sglang/srt/model_executor/runner/decode_cuda_graph_runner.py", 602, "__init__")])


def load_oom(p: Plan) -> StartupError:
    """torch's OOM while the weights load (they alone exceed the free memory)."""
    total = p.gpu_mem_mib / 1024
    free = max(p.pre_gb, 0.0)
    return StartupError(
        "torch.OutOfMemoryError",
        f"CUDA out of memory. Tried to allocate {min(p.weights_gb - free, 2.0) + 0.5:.2f} "
        f"GiB. GPU 0 has a total capacity of {total:.2f} GiB of which {free * 0.02 * 1024:.2f} "
        f"MiB is free. Including non-PyTorch memory, this process has {total - free * 0.02:.2f}"
        " GiB memory in use.",
        [("sglang/srt/model_loader/loader.py", 612, "load_weights_and_postprocess")])


def capture_error(p: Plan) -> StartupError | None:
    """The decode-graph capture OOM when graphs plus activation scratch (0.25 GiB) do not
    fit in what the KV pool and the prefill graphs left (the (1 - mfs) slack)."""
    if not p.decode_graphs:
        return None
    avail = p.after_pool_gb - (p.prefill_graph_gb if p.prefill_graphs else 0.0)
    need = p.decode_graph_gb + 0.25
    if need <= avail:
        return None
    return capture_oom(p, tried_gb=need, avail_gb=max(avail - 0.12, 0.0))
