"""Model architecture records: what the memory planner needs to know about a checkpoint.

A record is built from the same keys SGLang reads from ``config.json``
(``sglang/srt/configs/model_config.py`` and ``sglang/srt/models/deepseek_v2.py``), so a
shipped record (``gpuserve/data/models/<name>.yaml``, a ``config:`` block plus sources) and a
model directory go through one parser. Quantization comes from ``quantization_config`` in
``config.json`` or from ModelOpt's ``hf_quant_config.json``; its exclusion list decides which
parts stay in BF16 (NVFP4 checkpoints keep attention and shared experts unquantized).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from gpuserve import safeload
from gpuserve.errors import InputError
from gpuserve.memory.measured import RecordMeasurement, parse_record_measurements
from gpuserve.paths import MODELS_DIR, model_record_names

# Bytes per parameter of a quantized weight, scales included.
#  fp8 block-wise: 1 B + one fp32 scale per 128x128 block (DeepSeek-V3 quantization_config).
#  NVFP4: 4-bit values + one fp8 scale per 16 values (ModelOpt NVFP4 layout).
#  MXFP4: 4-bit values + one e8m0 scale per 32 values.
_QUANT_BYTES = {
    "fp8": 1.0 + 4 / (128 * 128),
    "modelopt_fp8": 1.0,
    "w8a8_fp8": 1.0,
    "modelopt_fp4": 0.5 + 1 / 16,
    "mxfp4": 0.5 + 1 / 32,
}
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "bf16": 2, "fp16": 2}

# Modules that no checkpoint format quantizes: SGLang builds them without quant_config
# (embeddings, the MoE router ``mlp.gate`` in models/deepseek_v2.py::MoEGate and
# qwen3_moe.py, norms).
_NEVER_QUANTIZED = ("embed", "lm_head", "router", "norm")


@dataclass(frozen=True)
class Quantization:
    """How a checkpoint stores its weights."""

    method: str  # SGLang quantization name: fp8, modelopt_fp4, ...
    bytes_per_param: float
    exclude: tuple[str, ...] = ()  # module-name patterns left unquantized
    kv_cache_quant_algo: str | None = None  # "FP8" makes SGLang's "auto" KV dtype fp8
    detail: str = ""
    weight_block_size: tuple[int, ...] = ()  # block-wise fp8: (block_n, block_k)

    def quantizes(self, module: str) -> bool:
        for pattern in self.exclude:
            if pattern.startswith("re:"):
                if re.match(pattern[3:], module):
                    return False
            elif any(ch in pattern for ch in "*?["):
                # a wildcard names a module or a prefix of one, as a plain name does:
                # gpt-oss's "model.layers.*.self_attn" covers its q/k/v/o projections
                if fnmatch.fnmatchcase(module, pattern) or fnmatch.fnmatchcase(
                    module, pattern + ".*"
                ):
                    return False
            elif module == pattern or module.startswith(pattern + "."):
                return False
        return True


@dataclass(frozen=True)
class ModelArch:
    """Architecture facts for memory planning (one record per checkpoint shape)."""

    name: str
    architecture: str
    model_type: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    tie_word_embeddings: bool
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    attention: str  # "mla", "dsa" (MLA + lightning indexer), "gqa" or "mha"
    intermediate_size: int  # dense MLP
    moe_layer_ids: tuple[int, ...]
    n_routed_experts: int = 0
    n_shared_experts: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    num_experts_per_tok: int = 0
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    index_head_dim: int = 0
    index_n_heads: int = 0
    index_topk: int = 0
    index_layer_ids: tuple[int, ...] = ()
    mtp_layers: int = 0
    max_position_embeddings: int | None = None
    dtype: str = "bfloat16"
    quantization: Quantization | None = None
    checkpoint_bytes: int | None = None
    sources: tuple[str, ...] = ()
    origin: str = ""
    notes: tuple[str, ...] = field(default=())
    # real starts of this model quoted with their sources (gpuserve.memory.measured)
    measured: tuple[RecordMeasurement, ...] = field(default=())

    @property
    def is_moe(self) -> bool:
        return bool(self.moe_layer_ids) and self.n_routed_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.attention in ("mla", "dsa")

    @property
    def dense_layer_ids(self) -> tuple[int, ...]:
        moe = set(self.moe_layer_ids)
        return tuple(i for i in range(self.num_layers) if i not in moe)

    @property
    def dtype_bytes(self) -> int:
        return _DTYPE_BYTES.get(self.dtype, 2)

    @property
    def quant_label(self) -> str:
        return self.quantization.method if self.quantization else self.dtype

    def unquantized_parts(self) -> list[str]:
        """Which component kinds a quantized checkpoint keeps at full precision."""
        if self.quantization is None:
            return []
        kept = []
        for kind, module in component_modules(self).items():
            if kind in _NEVER_QUANTIZED or not self.quantization.quantizes(module):
                kept.append(kind)
        return kept


def component_modules(arch: ModelArch) -> dict[str, str]:
    """A representative HF module name per component, to test quantization exclusions."""
    moe = arch.moe_layer_ids[0] if arch.moe_layer_ids else 0
    dense = arch.dense_layer_ids[0] if arch.dense_layer_ids else 0
    attn = "self_attn.q_b_proj" if arch.is_mla else "self_attn.q_proj"
    mods = {
        "embed": "model.embed_tokens",
        "lm_head": "lm_head",
        "attention": f"model.layers.{moe}.{attn}",
        "norm": f"model.layers.{moe}.input_layernorm",
    }
    if arch.attention == "dsa":
        mods["indexer"] = f"model.layers.{moe}.self_attn.indexer.wk"
    if arch.dense_layer_ids and arch.intermediate_size:
        mods["dense_mlp"] = f"model.layers.{dense}.mlp.gate_proj"
    if arch.is_moe:
        mods["router"] = f"model.layers.{moe}.mlp.gate"
        mods["routed_experts"] = f"model.layers.{moe}.mlp.experts.0.gate_proj"
        if arch.n_shared_experts or arch.shared_expert_intermediate_size:
            mods["shared_experts"] = f"model.layers.{moe}.mlp.shared_experts.gate_proj"
    if arch.mtp_layers:
        mods["mtp"] = f"model.layers.{arch.num_layers}.mlp.experts.0.gate_proj"
    return mods


# ---------------------------------------------------------------------------- parsing


def _req(cfg: dict, key: str, file: str, *alts: str) -> Any:
    for k in (key, *alts):
        if cfg.get(k) is not None:
            return cfg[k]
    raise InputError(file, key, "missing in config.json (needed for memory planning)")


def _int(cfg: dict, key: str, file: str, default: Any = None, *alts: str) -> Any:
    for k in (key, *alts):
        value = cfg.get(k)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool):
                raise InputError(file, k, f"expected an integer, got {value!r}")
            return value
    return default


def _moe_layers(cfg: dict, num_layers: int, n_experts: int, file: str) -> tuple[int, ...]:
    if not n_experts:
        return ()
    if "first_k_dense_replace" in cfg or "moe_layer_freq" in cfg:
        # models/deepseek_v2.py: MoE iff id >= first_k_dense_replace and id % moe_layer_freq == 0
        first_k = _int(cfg, "first_k_dense_replace", file, 0)
        freq = _int(cfg, "moe_layer_freq", file, 1) or 1
        return tuple(i for i in range(num_layers) if i >= first_k and i % freq == 0)
    # models/qwen3_moe.py: MoE iff not in mlp_only_layers and (id + 1) % decoder_sparse_step == 0
    only_dense = set(cfg.get("mlp_only_layers") or [])
    step = _int(cfg, "decoder_sparse_step", file, 1) or 1
    return tuple(i for i in range(num_layers) if i not in only_dense and (i + 1) % step == 0)


def _expert_size(cfg: dict, file: str) -> int:
    """One expert's intermediate size: ``moe_intermediate_size``, else, for the configs that
    count experts in ``num_local_experts`` (gpt-oss, Mixtral), ``intermediate_size``: SGLang
    builds their experts with it (models/gpt_oss.py, models/mixtral.py)."""
    size = _int(cfg, "moe_intermediate_size", file, 0)
    if not size and cfg.get("num_local_experts"):
        size = _int(cfg, "intermediate_size", file, 0)
    return size


def _index_layers(cfg: dict, num_layers: int) -> tuple[int, ...]:
    """DSA layers that own an indexer K cache (configs/model_config.py::dsa_layer_skips_topk)."""
    types = cfg.get("indexer_types")
    if types is not None:
        return tuple(i for i in range(num_layers) if not (i < len(types) and types[i] == "shared"))
    freq = cfg.get("index_topk_freq") or 1
    offset = cfg.get("index_skip_topk_offset")
    if offset is not None:
        return tuple(i for i in range(num_layers) if max(i - offset + 1, 0) % freq == 0)
    return tuple(i for i in range(num_layers) if max(i - 1, 0) % freq == 0)


def parse_quantization(qcfg: dict | None, file: str) -> Quantization | None:
    """Map a ``quantization_config`` / ``hf_quant_config.json`` dict to a Quantization."""
    if not qcfg:
        return None
    if not isinstance(qcfg, dict):
        raise InputError(file, "quantization_config", f"must be a mapping, got {qcfg!r}")
    if "quantization" in qcfg and isinstance(qcfg["quantization"], dict):
        qcfg = {**qcfg["quantization"], "quant_method": "modelopt"}  # hf_quant_config.json
    method = str(qcfg.get("quant_method", "")).lower()
    algo = str(qcfg.get("quant_algo") or "").upper()
    kv_algo = qcfg.get("kv_cache_quant_algo")
    exclude = tuple(
        qcfg.get("exclude_modules")
        or qcfg.get("ignore")
        or qcfg.get("ignored_layers")
        or qcfg.get("modules_to_not_convert")
        or ()
    )
    if method == "modelopt" or algo:
        if "FP4" in algo:
            name = "modelopt_fp4"
        elif "FP8" in algo:
            name = "modelopt_fp8"
        else:
            raise InputError(file, "quant_algo", f"unsupported ModelOpt algorithm {algo!r}")
    elif method == "fp8":
        name = "fp8"
    elif method == "mxfp4":
        name = "mxfp4"
    else:
        raise InputError(
            file,
            "quantization_config.quant_method",
            f"unsupported quantization {method!r} (planner knows fp8, modelopt FP8/NVFP4, mxfp4)",
        )
    detail = ", ".join(
        f"{k}={qcfg[k]}" for k in ("quant_algo", "fmt", "weight_block_size") if k in qcfg
    )
    return Quantization(
        method=name,
        bytes_per_param=_QUANT_BYTES[name],
        exclude=exclude,
        kv_cache_quant_algo=str(kv_algo) if kv_algo else None,
        detail=detail,
        weight_block_size=_block_size(qcfg.get("weight_block_size"), file),
    )


def _block_size(value: object, file: str) -> tuple[int, ...]:
    if not value:
        return ()
    if not isinstance(value, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in value
    ):
        raise InputError(file, "quantization_config.weight_block_size",
                         f"must be a list of positive integers, got {value!r}")
    return tuple(value)


def arch_from_config(
    cfg: dict,
    *,
    name: str,
    file: str,
    quant: dict | None = None,
    checkpoint_bytes: int | None = None,
    sources: tuple[str, ...] = (),
    notes: tuple[str, ...] = (),
) -> ModelArch:
    """Build a ModelArch from config.json keys (the keys SGLang itself reads)."""
    if not isinstance(cfg, dict):
        raise InputError(file, "config", "expected a mapping of config.json keys")
    text = cfg.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" not in cfg:
        cfg = {**text, **{k: v for k, v in cfg.items() if k != "text_config"}}
    archs = cfg.get("architectures") or ["unknown"]
    hidden = _int(cfg, "hidden_size", file) or _req(cfg, "hidden_size", file)
    layers = _int(cfg, "num_hidden_layers", file) or _req(cfg, "num_hidden_layers", file)
    heads = _int(cfg, "num_attention_heads", file) or _req(cfg, "num_attention_heads", file)
    kv_heads = _int(cfg, "num_key_value_heads", file, heads)
    vocab = _int(cfg, "vocab_size", file) or _req(cfg, "vocab_size", file)
    kv_lora = _int(cfg, "kv_lora_rank", file, 0)
    if kv_lora:
        attention = "dsa" if cfg.get("index_topk") is not None else "mla"
    else:
        attention = "gqa" if kv_heads < heads else "mha"
    head_dim = _int(cfg, "head_dim", file, hidden // heads)
    n_experts = _int(cfg, "n_routed_experts", file, 0, "num_experts", "num_local_experts")
    moe_ids = _moe_layers(cfg, layers, n_experts, file)
    quantization = parse_quantization(
        quant if quant is not None else cfg.get("quantization_config"), file
    )
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    return ModelArch(
        name=name,
        architecture=str(archs[0]),
        model_type=str(cfg.get("model_type", "")),
        hidden_size=hidden,
        num_layers=layers,
        vocab_size=vocab,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        v_head_dim=_int(cfg, "v_head_dim", file, head_dim),
        attention=attention,
        intermediate_size=_int(cfg, "intermediate_size", file, 0),
        moe_layer_ids=moe_ids,
        n_routed_experts=n_experts,
        n_shared_experts=_int(cfg, "n_shared_experts", file, 0),
        moe_intermediate_size=_expert_size(cfg, file),
        shared_expert_intermediate_size=_int(cfg, "shared_expert_intermediate_size", file, 0),
        num_experts_per_tok=_int(cfg, "num_experts_per_tok", file, 0),
        q_lora_rank=_int(cfg, "q_lora_rank", file, None),
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=_int(cfg, "qk_rope_head_dim", file, 0),
        qk_nope_head_dim=_int(cfg, "qk_nope_head_dim", file, 0),
        index_head_dim=_int(cfg, "index_head_dim", file, 0) if attention == "dsa" else 0,
        index_n_heads=_int(cfg, "index_n_heads", file, 0) if attention == "dsa" else 0,
        index_topk=_int(cfg, "index_topk", file, 0) if attention == "dsa" else 0,
        index_layer_ids=_index_layers(cfg, layers) if attention == "dsa" else (),
        mtp_layers=_int(cfg, "num_nextn_predict_layers", file, 0),
        max_position_embeddings=_int(cfg, "max_position_embeddings", file, None),
        dtype=dtype,
        quantization=quantization,
        checkpoint_bytes=checkpoint_bytes,
        sources=sources,
        origin=file,
        notes=notes,
    )


def _load_json(path: Path) -> dict:
    # A checkpoint's config.json is user-provided: bounded size/depth, finite numbers.
    data = safeload.load_json_file(path, safeload.CONFIG)
    if not isinstance(data, dict):
        raise InputError(path, None, f"must be a JSON object, got {type(data).__name__}")
    return data


def from_directory(path: str | Path) -> ModelArch:
    """Read a model directory: config.json, hf_quant_config.json, safetensors index."""
    root = Path(path)
    config_file = root / "config.json"
    if not config_file.is_file():
        raise InputError(root, "config.json", "model directory has no config.json")
    cfg = _load_json(config_file)
    quant = None
    if (root / "hf_quant_config.json").is_file():
        quant = _load_json(root / "hf_quant_config.json")
    total = None
    index = root / "model.safetensors.index.json"
    if index.is_file():
        metadata = _load_json(index).get("metadata") or {}
        total = metadata.get("total_size") if isinstance(metadata, dict) else None
        if total is not None and (isinstance(total, bool) or not isinstance(total, int)):
            raise InputError(index, "metadata.total_size", f"must be an integer, got {total!r}")
    return arch_from_config(
        cfg, name=root.name, file=str(config_file), quant=quant, checkpoint_bytes=total
    )


#: The shipped records' names (gpuserve/paths.py: the profiles check model.arch with it).
record_names = model_record_names


def load_record(name: str) -> ModelArch:
    """Load a shipped record ``gpuserve/data/models/<name>.yaml``."""
    path = MODELS_DIR / f"{name}.yaml"
    if not path.is_file():
        lowered = {n.lower(): n for n in record_names()}
        if name.lower() in lowered:
            path = MODELS_DIR / f"{lowered[name.lower()]}.yaml"
        else:
            raise InputError(
                "--model", "model", f"no record {name!r}; known: {', '.join(record_names())}"
            )
    return _record_file(path, safeload.file_version(path))


@lru_cache(maxsize=64)
def _record_file(path: Path, _version: tuple[int, int, int] | None) -> ModelArch:
    """One record file read and checked once per version of it (safeload.file_version): a
    tune plans every candidate and the judge each twice, each from the record; the
    result is frozen, so one copy serves them all."""
    data = safeload.load_yaml_file(path)
    if not isinstance(data, dict):
        raise InputError(path, None, "a model record must be a YAML mapping")
    for key in ("config", "sources"):
        if key not in data:
            raise InputError(path, key, "model record needs this key")
    arch = arch_from_config(
        data["config"],
        name=path.stem,
        file=str(path),
        quant=data.get("quantization_config"),
        checkpoint_bytes=data.get("checkpoint_bytes"),
        sources=tuple(data["sources"]),
        notes=tuple(data.get("notes") or ()),
    )
    measured = parse_record_measurements(data.get("measured"), str(path))
    return replace(arch, measured=measured) if measured else arch


def resolve_model(name_or_dir: str | Path) -> ModelArch:
    """``--model``: a directory holding config.json, else a record name."""
    path = Path(name_or_dir)
    if path.is_dir():
        return from_directory(path)
    return load_record(str(name_or_dir))
