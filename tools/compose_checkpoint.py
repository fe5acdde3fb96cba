#!/usr/bin/env python3
"""Compose a real-format, weight-less safetensors checkpoint from a config.json.

    .venv/bin/python tools/compose_checkpoint.py --record glm-5-nvfp4 --out DIR [--shards 80]
    .venv/bin/python tools/compose_checkpoint.py --config DIR/config.json --out DIR

Why: the memory preflight reads a checkpoint's safetensors headers (checkpoint_scan.py), and
tests and the lab need checkpoints of real models' shapes without hundreds of GB of weights.
The directory holds what an export holds: config.json (+ hf_quant_config.json for ModelOpt),
model.safetensors.index.json (weight_map, metadata.total_size) and N shards whose headers
carry the tensor names, dtypes, shapes and contiguous data_offsets the architecture implies.
The data is SPARSE (file.truncate to the full size): no weight byte is written. Every
directory carries a COMPOSED.md naming the config source and this tool, so nobody mistakes
it for a download.

Naming (Hugging Face checkpoints): DeepSeek-V3/V3.2 and GLM-5 (MLA, DSA indexer, MoE with
shared experts, MTP layers at index >= num_hidden_layers), Qwen3-MoE and Llama (GQA).
Quantized linears: ModelOpt NVFP4 (U8 weight [out, in/2] + F8_E4M3 weight_scale per 16
+ F32 weight_scale_2 and input_scale), block fp8 (F8_E4M3 weight + F32 weight_scale_inv per
128x128); what the quantization config excludes stays in the config's dtype.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpuserve.memory.models import (  # noqa: E402
    MODELS_DIR,
    ModelArch,
    Quantization,
    arch_from_config,
)

Tensor = tuple[str, str, list[int]]  # name, safetensors dtype, shape
_DTYPE = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
_BITS = {"BF16": 16, "F16": 16, "F32": 32, "U8": 8, "F8_E4M3": 8}


def nbytes(dtype: str, shape: list[int]) -> int:
    return math.prod(shape) * _BITS[dtype] // 8


class _Writer:
    """Emit the tensors of one linear or norm in the checkpoint's storage format."""

    def __init__(self, arch: ModelArch) -> None:
        self.arch = arch
        self.dtype = _DTYPE.get(arch.dtype, "BF16")
        self.q: Quantization | None = arch.quantization

    def norm(self, name: str, dim: int, bias: bool = False) -> Iterator[Tensor]:
        yield f"{name}.weight", self.dtype, [dim]
        if bias:
            yield f"{name}.bias", self.dtype, [dim]

    def linear(self, module: str, out: int, inp: int, quantizable: bool = True) -> Iterator[Tensor]:
        q = self.q
        if q is None or not quantizable or not q.quantizes(module):
            yield f"{module}.weight", self.dtype, [out, inp]
        elif q.method == "modelopt_fp4":
            yield f"{module}.weight", "U8", [out, inp // 2]
            yield f"{module}.weight_scale", "F8_E4M3", [out, inp // 16]
            yield f"{module}.weight_scale_2", "F32", []
            yield f"{module}.input_scale", "F32", []
        elif q.method in ("fp8",):
            bn, bk = (list(q.weight_block_size) or [128, 128])[:2]
            yield f"{module}.weight", "F8_E4M3", [out, inp]
            yield f"{module}.weight_scale_inv", "F32", [-(-out // bn), -(-inp // bk)]
        elif q.method in ("modelopt_fp8", "w8a8_fp8"):
            yield f"{module}.weight", "F8_E4M3", [out, inp]
            yield f"{module}.weight_scale", "F32", []
            yield f"{module}.input_scale", "F32", []
        else:
            raise ValueError(f"compose: no storage layout for quantization {q.method!r}")


def _attention(w: _Writer, p: str, layer: int) -> Iterator[Tensor]:
    a = w.arch
    h = a.hidden_size
    if a.is_mla:
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        heads = a.num_attention_heads
        if a.q_lora_rank:
            yield from w.linear(f"{p}.self_attn.q_a_proj", a.q_lora_rank, h)
            yield from w.norm(f"{p}.self_attn.q_a_layernorm", a.q_lora_rank)
            yield from w.linear(f"{p}.self_attn.q_b_proj", heads * qk, a.q_lora_rank)
        else:
            yield from w.linear(f"{p}.self_attn.q_proj", heads * qk, h)
        yield from w.linear(
            f"{p}.self_attn.kv_a_proj_with_mqa", a.kv_lora_rank + a.qk_rope_head_dim, h
        )
        yield from w.norm(f"{p}.self_attn.kv_a_layernorm", a.kv_lora_rank)
        yield from w.linear(
            f"{p}.self_attn.kv_b_proj", heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank
        )
        yield from w.linear(f"{p}.self_attn.o_proj", h, heads * a.v_head_dim)
        if a.attention == "dsa" and (layer in a.index_layer_ids or layer >= a.num_layers):
            ix = f"{p}.self_attn.indexer"
            q_in = a.q_lora_rank or h
            yield from w.linear(f"{ix}.wq_b", a.index_n_heads * a.index_head_dim, q_in)
            yield from w.linear(f"{ix}.wk", a.index_head_dim, h)
            yield from w.norm(f"{ix}.k_norm", a.index_head_dim, bias=True)
            yield from w.linear(f"{ix}.weights_proj", a.index_n_heads, h, quantizable=False)
        return
    hd, heads, kv = a.head_dim, a.num_attention_heads, a.num_kv_heads
    yield from w.linear(f"{p}.self_attn.q_proj", heads * hd, h)
    yield from w.linear(f"{p}.self_attn.k_proj", kv * hd, h)
    yield from w.linear(f"{p}.self_attn.v_proj", kv * hd, h)
    yield from w.linear(f"{p}.self_attn.o_proj", h, heads * hd)
    if a.model_type.startswith("qwen3"):
        yield from w.norm(f"{p}.self_attn.q_norm", hd)
        yield from w.norm(f"{p}.self_attn.k_norm", hd)


def _mlp(w: _Writer, p: str, inter: int) -> Iterator[Tensor]:
    h = w.arch.hidden_size
    yield from w.linear(f"{p}.gate_proj", inter, h)
    yield from w.linear(f"{p}.up_proj", inter, h)
    yield from w.linear(f"{p}.down_proj", h, inter)


def _layer(w: _Writer, layer: int, moe: bool) -> Iterator[Tensor]:
    a = w.arch
    h = a.hidden_size
    p = f"model.layers.{layer}"
    yield from w.norm(f"{p}.input_layernorm", h)
    yield from _attention(w, p, layer)
    yield from w.norm(f"{p}.post_attention_layernorm", h)
    if not moe:
        yield from _mlp(w, f"{p}.mlp", a.intermediate_size)
        return
    yield f"{p}.mlp.gate.weight", w.dtype, [a.n_routed_experts, h]
    if a.architecture.startswith(("Deepseek", "Glm", "Kimi")):
        yield f"{p}.mlp.gate.e_score_correction_bias", "F32", [a.n_routed_experts]
    for e in range(a.n_routed_experts):
        yield from _mlp(w, f"{p}.mlp.experts.{e}", a.moe_intermediate_size)
    shared = a.moe_intermediate_size * a.n_shared_experts or a.shared_expert_intermediate_size
    if shared:
        yield from _mlp(w, f"{p}.mlp.shared_experts", shared)


def tensors(arch: ModelArch) -> Iterator[Tensor]:
    """Every tensor of the checkpoint, in export order (embedding, layers, MTP, head)."""
    w = _Writer(arch)
    h, v = arch.hidden_size, arch.vocab_size
    yield "model.embed_tokens.weight", w.dtype, [v, h]
    moe_ids = set(arch.moe_layer_ids)
    for i in range(arch.num_layers):
        yield from _layer(w, i, i in moe_ids)
    for i in range(arch.num_layers, arch.num_layers + arch.mtp_layers):
        # DeepSeek-V3 MTP layer: a full MoE decoder layer plus the projection of
        # [embedding; hidden] and its own copy of the embedding and head.
        p = f"model.layers.{i}"
        yield f"{p}.embed_tokens.weight", w.dtype, [v, h]
        yield from w.norm(f"{p}.enorm", h)
        yield from w.norm(f"{p}.hnorm", h)
        yield from w.linear(f"{p}.eh_proj", h, 2 * h)
        yield from _layer(w, i, arch.is_moe)
        yield from w.norm(f"{p}.shared_head.norm", h)
        yield f"{p}.shared_head.head.weight", w.dtype, [v, h]
    yield "model.norm.weight", w.dtype, [h]
    if not arch.tie_word_embeddings:
        yield "lm_head.weight", w.dtype, [v, h]


def _split(items: list[Tensor], shards: int) -> list[list[Tensor]]:
    """Cut the tensor list into ``shards`` runs of about equal bytes, in order."""
    total = sum(nbytes(d, s) for _, d, s in items)
    target = total / shards
    out: list[list[Tensor]] = [[]]
    acc = 0
    for t in items:
        if acc >= target * len(out) and len(out) < shards:
            out.append([])
        out[-1].append(t)
        acc += nbytes(t[1], t[2])
    return [s for s in out if s]


def write_shard(path: Path, items: list[Tensor], fill: str = "sparse") -> int:
    """Write one shard's header, then its data: ``sparse`` truncates the file to its full
    size (a hole, no byte written); ``pattern`` writes deterministic pseudo-random bytes
    seeded by the file name (a small checkpoint that is really downloaded, so a copy
    that never wrote its data cannot pass for it)."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape in items:
        size = nbytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the library pads the header to 8 bytes with spaces
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        if fill == "pattern":
            rng = random.Random(path.name)
            left = offset
            while left:
                n = min(left, 1 << 20)
                f.write(rng.randbytes(n))
                left -= n
        elif fill != "sparse":
            raise ValueError(f"compose: fill {fill!r}: use sparse or pattern")
        f.truncate(8 + len(raw) + offset)
    return offset


def compose(
    config: dict,
    out: Path,
    *,
    quant: dict | None = None,
    shards: int = 1,
    source: str = "",
    fill: str = "sparse",
) -> dict:
    """Write the composed checkpoint into ``out``; returns the index document."""
    hf_quant = quant if quant and "quantization" in quant else None
    cfg = dict(config)
    if quant and hf_quant is None:
        cfg["quantization_config"] = quant
    arch = arch_from_config(cfg, name=out.name, file=source or "config.json", quant=hf_quant)
    items = list(tensors(arch))
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.safetensors"):
        old.unlink()
    parts = _split(items, max(1, shards))
    weight_map: dict[str, str] = {}
    total = 0
    for i, part in enumerate(parts, 1):
        name = f"model-{i:05d}-of-{len(parts):05d}.safetensors"
        total += write_shard(out / name, part, fill)
        weight_map.update({t[0]: name for t in part})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    if hf_quant is not None:
        (out / "hf_quant_config.json").write_text(json.dumps(hf_quant, indent=2) + "\n")
    data = ("every\ndata byte is a hole" if fill == "sparse" else
            "the data\nare pseudo-random filler bytes, not trained weights")
    (out / "COMPOSED.md").write_text(
        "# Composed checkpoint (no weights)\n\n"
        f"Written by tools/compose_checkpoint.py from {source or 'a config.json'}.\n"
        f"{len(items)} tensors in {len(parts)} shards, {total} bytes of {fill} data: the\n"
        f"headers carry the real tensor names, dtypes and shapes the config implies; {data}.\n"
        "Not a trained model: do not serve it expecting output.\n"
    )
    return index


def inputs_digest(config: dict, quant: dict | None, shards: int) -> str:
    """A digest of everything a composed directory depends on (its cache key)."""
    tool = Path(__file__).read_bytes()
    doc = json.dumps({"config": config, "quant": quant, "shards": shards}, sort_keys=True)
    return hashlib.sha256(tool + doc.encode()).hexdigest()


def load_record_inputs(name: str) -> tuple[dict, dict | None, str]:
    """(config, quantization config, source) of a shipped model record."""
    import yaml

    path = MODELS_DIR / f"{name}.yaml"
    data = yaml.safe_load(path.read_text())
    return data["config"], data.get("quantization_config"), str(path.relative_to(ROOT))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--record", help="model record name in gpuserve/data/models")
    src.add_argument("--config", type=Path, help="a config.json (hf_quant_config.json beside)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--layers", type=int, help="keep only this many decoder layers (tiny tests)")
    p.add_argument("--fill", choices=("sparse", "pattern"), default="sparse",
                   help="data bytes: holes (default) or deterministic pseudo-random filler")
    a = p.parse_args(argv)
    if a.record:
        config, quant, source = load_record_inputs(a.record)
    else:
        config = json.loads(a.config.read_text())
        hq = a.config.parent / "hf_quant_config.json"
        quant = json.loads(hq.read_text()) if hq.is_file() else config.get("quantization_config")
        source = str(a.config)
    if a.layers:
        config = {**config, "num_hidden_layers": a.layers}
    index = compose(config, a.out, quant=quant, shards=a.shards, source=source, fill=a.fill)
    print(f"{a.out}: {len(index['weight_map'])} tensors, {index['metadata']['total_size']:,} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
