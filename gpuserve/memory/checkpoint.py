"""Weights per GPU from a real checkpoint's safetensors headers instead of the model record.

A model record (``gpuserve/data/models/*.yaml``) is a config.json plus a reconstructed
quantization config; a real export can differ (which modules stay BF16, scales, extra
tensors), and the difference lands in the KV budget. ``checkpoint_scan.py`` (run on the host,
or imported here so there is one implementation) describes every tensor pattern by dtype,
count and bytes; this module classifies each pattern into the planner's components by name
and applies the planner's own sharding table (``planner.shard``) to the bytes.

Naming: DeepSeek-V3/V3.2 and GLM-5 (MLA, DSA indexer, MoE, shared experts, MTP layers at
index >= num_hidden_layers), Qwen3-MoE and Llama. Unknown names are "other": replicated and
listed, so a user sees what the planner did not recognise.
"""

from __future__ import annotations

import importlib.util
import math
import re
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any

from gpuserve import safeload
from gpuserve.errors import InputError
from gpuserve.memory.models import ModelArch, arch_from_config
from gpuserve.memory.planner import Layout, WeightPart, shard, uses_builtin_mtp
from gpuserve.paths import SCRIPTS_DIR

SCAN_SCRIPT = SCRIPTS_DIR / "checkpoint_scan.py"
SCHEMA = "gpuserve.checkpoint_scan/1"
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# Scale tensors carry no parameters of their own (ModelOpt, block fp8, KV scales).
_SCALE_SUFFIXES = (
    ".weight_scale", ".weight_scale_2", ".input_scale", ".weight_scale_inv",
    ".k_scale", ".v_scale",
)


@dataclass(frozen=True)
class TensorGroup:
    """Tensors whose names differ only in the expert index (or one tensor)."""

    pattern: str
    dtype: str
    count: int
    nbytes: int
    shape: tuple[int, ...]

    @property
    def params(self) -> int:
        """Logical parameters: packed FP4 (U8 weight with a weight_scale) holds 2 per byte;
        scale tensors hold none."""
        if self.pattern.endswith(_SCALE_SUFFIXES):
            return 0
        n = self.count * math.prod(self.shape)
        return 2 * n if self.dtype == "U8" and self.pattern.endswith(".weight") else n


@dataclass(frozen=True)
class ScanFile:
    name: str
    size: int
    tensors: int


@dataclass(frozen=True)
class CheckpointScan:
    """What checkpoint_scan.py saw in one model directory."""

    directory: str
    config: dict
    hf_quant_config: dict | None
    files: tuple[ScanFile, ...]
    tensors: tuple[TensorGroup, ...]
    index_total_size: int | None = None

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def tensor_count(self) -> int:
        return sum(t.count for t in self.tensors)

    def arch(self, name: str | None = None) -> ModelArch:
        """The model's architecture from the checkpoint's own config.json."""
        return arch_from_config(
            self.config,
            name=name or Path(self.directory).name,
            file=f"{self.directory}/config.json",
            quant=self.hf_quant_config,
        )


# ------------------------------------------------------------------------- parsing


@cache
def scan_module() -> ModuleType:
    """The host script, imported so the controller runs the very code the host runs."""
    spec = importlib.util.spec_from_file_location("gpuserve_checkpoint_scan", SCAN_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def scan_directory(path: str | Path) -> CheckpointScan:
    """Scan a local checkpoint directory (config.json + safetensors headers)."""
    return scan_from_dict(scan_module().scan(str(path)), str(path))


def parse_scan(text: str, source: str = "checkpoint_scan.py output") -> CheckpointScan:
    """Parse the JSON document checkpoint_scan.py printed on a host."""
    # Printed on a host: bounded size and depth, finite numbers (gpuserve/safeload.py).
    try:
        doc = safeload.loads_json(text, source)
    except InputError as exc:
        why = exc.message.removeprefix("invalid JSON: ")
        raise InputError(source, None, f"not JSON: {why}", exc.line) from None
    return scan_from_dict(doc, source)


def scan_from_dict(doc: Any, source: str) -> CheckpointScan:
    """Check the scan document; the scan's first error becomes an InputError naming the
    checkpoint file (shard, config.json) and what is wrong with it."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise InputError(source, "schema", f"not a {SCHEMA} document")
    directory = str(doc.get("dir") or source)
    errors = doc.get("errors") or []
    if errors:
        first = errors[0]
        file = str(first.get("file") or directory)
        if not file.startswith("/") and file != directory:
            file = f"{directory.rstrip('/')}/{file}"
        more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
        raise InputError(file, first.get("field"), f"{first.get('error')}{more}")
    if not isinstance(doc.get("config"), dict):
        raise InputError(f"{directory}/config.json", None, "missing or not a JSON object")
    try:
        files = tuple(ScanFile(f["name"], int(f["size"]), int(f["tensors"])) for f in doc["files"])
        tensors = tuple(
            TensorGroup(str(p), str(d), int(c), int(b), tuple(int(x) for x in s))
            for p, d, c, b, s in doc["tensors"]
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(source, "tensors", f"malformed scan document: {exc!r}") from None
    return CheckpointScan(
        directory=directory,
        config=doc["config"],
        hf_quant_config=doc.get("hf_quant_config"),
        files=files,
        tensors=tensors,
        index_total_size=doc.get("index_total_size"),
    )


# ------------------------------------------------------------------------- components

_ATTN_REPLICATED = ("q_a_proj", "kv_a_proj_with_mqa", "q_a_layernorm", "kv_a_layernorm")
_ATTN_KV = ("k_proj", "v_proj")
_ATTN_SHARDED = ("q_proj", "q_b_proj", "kv_b_proj", "o_proj", "qkv_proj")
_MTP_EXTRA = ("enorm.", "hnorm.", "eh_proj.", "shared_head.norm.")
_MTP_SHARED = ("embed_tokens.", "shared_head.head.")


def classify_layer_tensor(rest: str, moe_layer: bool) -> str:
    """The component of ``model.layers.N.<rest>`` (a decoder layer's tensor)."""
    if rest.startswith("self_attn."):
        sub = rest[len("self_attn."):]
        module = sub.split(".")[0]
        if module == "indexer":
            return "indexer"
        if module in _ATTN_REPLICATED:
            return "attention_replicated"
        if module in _ATTN_KV:
            return "attention_kv"
        if module in _ATTN_SHARDED:
            return "attention"
        if module in ("q_norm", "k_norm"):
            return "norm"
        return "other"
    if rest.startswith(("input_layernorm.", "post_attention_layernorm.")):
        return "norm"
    if rest.startswith("mlp.experts."):
        return "routed_experts"
    if rest.startswith(("mlp.shared_experts.", "mlp.shared_expert.", "mlp.shared_expert_gate.")):
        return "shared_experts"
    if rest.startswith("mlp.gate.") and rest.split(".")[2] in ("weight", "e_score_correction_bias"):
        return "router"
    if rest.startswith(("mlp.gate_proj.", "mlp.up_proj.", "mlp.down_proj.")):
        return "shared_experts" if moe_layer else "dense_mlp"
    return "other"


def classify(name: str, arch: ModelArch) -> tuple[str, int | None]:
    """(component, MTP layer index or None) of one tensor pattern.

    Components are the planner's ``shard`` kinds; MTP layers (index >= num_hidden_layers)
    also get ``mtp_extra`` (eh_proj, enorm, hnorm, shared_head.norm) and ``mtp_shared``
    (their embedding and head copies, which SGLang replaces with the target's).
    """
    if name.startswith(("model.embed_tokens.", "model.embed.")):
        return "embed", None
    if name.startswith("lm_head."):
        return "lm_head", None
    if name.startswith("model.norm."):
        return "norm", None
    m = _LAYER.match(name)
    if not m:
        return "other", None
    layer, rest = int(m.group(1)), m.group(2)
    if layer >= arch.num_layers:
        if rest.startswith(_MTP_SHARED):
            return "mtp_shared", layer
        if rest.startswith(_MTP_EXTRA):
            return "mtp_extra", layer
        return classify_layer_tensor(rest, arch.is_moe), layer
    return classify_layer_tensor(rest, layer in set(arch.moe_layer_ids)), None


# Part names (and order) of planner.weights_per_gpu, so both paths print alike.
_PART_NAMES = {
    "embed": "embedding",
    "lm_head": "lm_head",
    "attention": "attention (sharded)",
    "attention_kv": "attention (sharded)",
    "attention_replicated": "attention (replicated)",
    "indexer": "DSA indexer",
    "norm": "norms",
    "dense_mlp": "dense MLP",
    "routed_experts": "routed experts",
    "router": "router",
    "shared_experts": "shared experts",
    "other": "other (unrecognised, replicated)",
}


@dataclass
class _Acc:
    params: float = 0.0
    nbytes: float = 0.0
    how: str = ""


@lru_cache(maxsize=16)
def _classified(tensors: tuple[TensorGroup, ...],
                arch: ModelArch) -> tuple[tuple[str, int | None, int, int], ...]:
    """(component, MTP layer or None, params, bytes) of each tensor pattern, in order. One
    scan is planned for many layouts (a tune plans every candidate, the judge each twice);
    classifying its ~2,400 patterns again each time was most of a plan's CPU."""
    return tuple((*classify(t.pattern, arch), t.params, t.nbytes) for t in tensors)


def checkpoint_weights(
    scan: CheckpointScan, layout: Layout, arch: ModelArch | None = None
) -> list[WeightPart]:
    """Weight bytes one GPU holds, by the planner's components, from the checkpoint's tensors.

    Each pattern's bytes times its component's ``planner.shard`` share; MTP layers count only
    when speculative decoding uses them (NEXTN/EAGLE with built-in MTP), and their own
    embedding/head copies never (SGLang shares the target's). The parts carry the record
    path's names so the planner's arithmetic and output are the same.
    """
    arch = arch or scan.arch()
    with_mtp = uses_builtin_mtp(arch, layout)
    dense = len(arch.dense_layer_ids) if arch.intermediate_size else 0
    names = dict(_PART_NAMES)
    names["dense_mlp"] = f"dense MLP x{dense}"
    names["routed_experts"] = f"routed experts x{len(arch.moe_layer_ids)} layers"
    acc: dict[str, _Acc] = {}
    mtp_layers: set[int] = set()
    shares: dict[str, tuple[float, str]] = {}
    for kind, mtp, params, nbytes in _classified(scan.tensors, arch):
        if mtp is not None:
            if not with_mtp or kind == "mtp_shared":
                continue
            mtp_layers.add(mtp)
        if kind not in shares:
            shares[kind] = shard(kind, layout, arch)
        share, how = shares[kind]
        part = "draft/MTP layers" if mtp is not None else names[kind]
        a = acc.setdefault(part, _Acc(how=how if mtp is None else "like one target layer"))
        a.params += params * share
        a.nbytes += nbytes * share
    order = list(dict.fromkeys([*names.values(), "draft/MTP layers"]))
    parts = []
    for part, a in sorted(acc.items(), key=lambda kv: order.index(kv[0])):
        if not a.nbytes:
            continue
        label = f"{part} x{len(mtp_layers)}" if part == "draft/MTP layers" else part
        params = a.params or a.nbytes
        parts.append(WeightPart(label, params, a.nbytes / params, a.how))
    return parts


def unrecognised(scan: CheckpointScan, arch: ModelArch | None = None) -> list[str]:
    """Tensor patterns the classifier did not know (counted as replicated "other")."""
    arch = arch or scan.arch()
    return [t.pattern for t in scan.tensors if classify(t.pattern, arch)[0] == "other"]
