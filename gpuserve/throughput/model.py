"""Output tokens per second of an SGLang launch, from the model's architecture, the box's
GPUs and link, and the workload (concurrency, input and output lengths).

A decode step reads the weights a GPU holds for the tokens of the step (dense parts
whole, routed experts only as far as the batch touches them) and the KV of each request's
context, against memory bandwidth (or FLOPs once the batch is large), plus the step's
collectives counted from the architecture (what SGLang all-reduces per layer, or what
EP's all-to-all replaces) at the link's cost, plus a fixed cost per layer and per step.
Speculative decoding runs its draft forwards and one verify forward over
num_draft_tokens per request, and gains the acceptance length per verify. Prefill is
FLOPs over the input. Why so: every term is a quantity of the launch, so a changed knob
moves the prediction for a reason that can be read; the box's own measurements calibrate
what the arithmetic cannot know.

How: docs/planner.md, "Throughput predictor".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpuserve.memory.models import ModelArch
from gpuserve.memory.planner import Layout, kv_cell, resolve_kv_dtype, weights_per_gpu
from gpuserve.throughput.hardware import Gpu, Link, defaults

#: a draft head of a separate EAGLE-3 checkpoint: one decoder layer and its own small
#: vocabulary (SpecForge heads: draft_vocab_size 32000)
EAGLE3_DRAFT_VOCAB = 32000
ACT_BYTES = 2  # bf16 activations on the wire


@dataclass(frozen=True)
class Speculation:
    algorithm: str
    num_steps: int = 3
    eagle_topk: int = 1
    num_draft_tokens: int = 4
    accept_length: float | None = None  # measured; else the algorithm's default

    def acceptance(self) -> float:
        """Tokens gained per verify: measured, else 1 + p + ... + p^steps with the
        algorithm's per-step rate p (defaults.yaml ``acceptance``), a tree's topk
        candidates counted as sqrt(topk) draws."""
        if self.accept_length:
            return float(self.accept_length)
        table = defaults()["acceptance"]
        p = float(table.get(self.algorithm.upper(), table["EAGLE3"])["per_step"])
        p = 1 - (1 - p) ** (max(1, self.eagle_topk) ** 0.5)  # a tree: any candidate
        gained = sum(p ** i for i in range(self.num_steps + 1))
        return min(gained, float(max(self.num_draft_tokens, 1)))


@dataclass(frozen=True)
class Workload:
    concurrency: int = 1
    input_len: int = 1024
    output_len: int = 1024
    decode_only: bool = False
    max_running: int | None = None  # the server's cap on running requests


@dataclass(frozen=True)
class Collectives:
    """Collectives of one forward of the target model (what SGLang runs, by layer)."""

    all_reduces: int
    gathers: int  # all-gathers and reduce-scatters (attention DP, logits)
    alltoalls: int
    why: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return self.all_reduces + self.gathers + self.alltoalls


def collectives(arch: ModelArch, layout: Layout) -> Collectives:
    """Per forward, from models/deepseek_v2.py and its kin: attention's o_proj output is
    all-reduced across the attention-TP group, the MLP's output (dense layers, and MoE
    layers with the shared expert added before it, fused or not) across TP; an
    all-to-all backend (deepep, flashinfer, mooncake) replaces a MoE layer's all-reduce
    by a dispatch and a combine; attention DP gathers tokens before the MLP and scatters
    them after; the vocab-parallel embedding all-reduces once, the logits gather once."""
    n, moe = arch.num_layers, len(arch.moe_layer_ids) if arch.is_moe else 0
    dense = n - moe
    ar = gathers = a2a = 0
    why = []
    if layout.attn_tp > 1:
        ar += n
        why.append(f"{n} attention outputs")
    a2a_moe = layout.moe_a2a_backend not in ("none", "", None) and layout.ep > 1
    if layout.tp > 1:
        if layout.attn_dp > 1:
            gathers += 2 * n
            why.append(f"{n} gathers and {n} scatters around the MLP (attention DP)")
        else:
            mlp = dense + (0 if a2a_moe else moe)
            ar += mlp
            why.append(f"{mlp} MLP/MoE outputs")
        if a2a_moe:
            a2a += 2 * moe
            why.append(f"{moe} MoE dispatches and {moe} combines ({layout.moe_a2a_backend})")
        ar += 1
        gathers += 1
        why.append("1 embedding all-reduce, 1 logits gather")
    return Collectives(ar, gathers, a2a, tuple(why))


@dataclass(frozen=True)
class Shape:
    """The bytes and FLOPs of one forward, per GPU, from the planner's weight parts."""

    dense_bytes: float
    expert_bytes: float
    dense_params: float
    expert_params: float
    draft_bytes: float
    lm_head_bytes: float
    kv_target: int  # KV bytes per token of context (attention reads), per GPU
    kv_indexer: int
    compute_dtype: str


def shape(arch: ModelArch, layout: Layout, kv_dtype: str, sm_major: int | None,
          parts: list | None = None) -> Shape:
    """Bytes and parameters per GPU by kind: ``parts`` (a checkpoint's weights per GPU,
    gpuserve.memory.checkpoint), else the record's (the planner's sharding)."""
    parts = parts if parts is not None else weights_per_gpu(arch, layout)
    expert = [p for p in parts if p.name.startswith("routed experts")]
    draft = [p for p in parts if p.name.startswith("draft/")]
    other = [p for p in parts if p not in expert and p not in draft
             and not p.name.startswith("embedding")]
    head = [p for p in parts if p.name.startswith("lm_head")]
    cell = kv_cell(arch, kv_dtype=resolve_kv_dtype(arch, kv_dtype), attn_tp=layout.attn_tp,
                   sm_major=sm_major)
    q = arch.quantization.method if arch.quantization else ""
    dtype = "fp4" if "fp4" in q else "fp8" if "fp8" in q else "bf16"
    return Shape(
        dense_bytes=sum(p.params_per_gpu * p.bytes_per_param for p in other),
        expert_bytes=sum(p.params_per_gpu * p.bytes_per_param for p in expert),
        dense_params=sum(p.params_per_gpu for p in other),
        expert_params=sum(p.params_per_gpu for p in expert),
        draft_bytes=sum(p.params_per_gpu * p.bytes_per_param for p in draft),
        lm_head_bytes=sum(p.params_per_gpu * p.bytes_per_param for p in head),
        kv_target=cell.target_bytes, kv_indexer=cell.indexer_bytes, compute_dtype=dtype)


@dataclass
class Step:
    """One forward's time and its parts (seconds)."""

    memory_s: float
    compute_s: float
    comm_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        return max(self.memory_s, self.compute_s) + self.comm_s + self.overhead_s


@dataclass
class Box:
    """The GPUs and link a launch runs on, and its calibration."""

    gpu: Gpu
    link: Link
    scale: float = 1.0  # calibration: predicted/measured of the box's baseline run

    def tflops(self, dtype: str) -> float:
        order = {"fp4": ("fp4", "fp8", "bf16"), "fp8": ("fp8", "bf16"), "bf16": ("bf16",)}
        for d in order.get(dtype, ("bf16",)):
            if self.gpu.tflops.get(d):
                return self.gpu.tflops[d]
        return 0.0


@dataclass
class Prediction:
    single_stream_tps: float
    output_tps: float
    per_user_tps: float
    concurrency: int
    step_ms: float  # one decode step (or speculative cycle) at the concurrency
    comm_ms: float  # of which collectives
    prefill_ms: float  # one request's prefill
    collectives_per_forward: int
    accept_length: float | None = None
    link: str = ""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"single_stream_tps": round(self.single_stream_tps, 2),
                "output_tps": round(self.output_tps, 2),
                "per_user_tps": round(self.per_user_tps, 2),
                "concurrency": self.concurrency, "step_ms": round(self.step_ms, 3),
                "comm_ms": round(self.comm_ms, 3), "prefill_ms": round(self.prefill_ms, 2),
                "collectives_per_forward": self.collectives_per_forward,
                "accept_length": (round(self.accept_length, 2)
                                  if self.accept_length else None),
                "link": self.link, "notes": self.notes}


def _touched(arch: ModelArch, tokens: float, ep: int = 1) -> float:
    """Share of a GPU's routed experts that ``tokens`` tokens touch (uniform routing).
    Under EP a GPU holds whole experts and the step waits for the busiest one: the
    expected maximum over ``ep`` ranks of its touched experts (mean + sd x sqrt(2 ln ep),
    the normal approximation); under TP every GPU holds a slice of each."""
    if not arch.is_moe or not arch.n_routed_experts:
        return 1.0
    k = arch.num_experts_per_tok / arch.n_routed_experts
    q = 1.0 - (1.0 - min(k, 1.0)) ** max(tokens, 1.0)
    if ep <= 1:
        return q
    n = arch.n_routed_experts / ep
    busiest = n * q + (n * q * (1 - q)) ** 0.5 * (2 * math.log(ep)) ** 0.5
    return min(1.0, busiest / n)


def forward(arch: ModelArch, layout: Layout, sh: Shape, box: Box, *, requests: int,
            tokens_each: int, context: int) -> Step:
    """One target forward of ``requests`` requests of ``tokens_each`` new tokens each
    (1: decode, num_draft_tokens: verify) over ``context`` tokens of KV."""
    eff = defaults()["efficiency"]
    tokens = requests * tokens_each
    local = max(1, -(-requests // layout.attn_dp))  # requests one attention rank holds
    ctx = context
    if arch.attention == "dsa" and arch.index_topk:
        ctx = min(context, arch.index_topk)  # DSA attends to its top-k tokens only
    kv = local * (sh.kv_target * ctx * (tokens_each if ctx < context else 1)
                  + sh.kv_indexer * context)
    weights = sh.dense_bytes + sh.expert_bytes * _touched(arch, tokens, layout.ep)
    memory = (weights + kv) / (box.gpu.bandwidth_gbs * 1e9)
    active = sh.dense_params + sh.expert_params * (
        arch.num_experts_per_tok / arch.n_routed_experts if arch.is_moe else 1.0)
    heads = max(1, arch.num_attention_heads // layout.attn_tp)
    dim = (arch.kv_lora_rank + arch.qk_rope_head_dim) * 2 if arch.is_mla else \
        arch.head_dim + arch.v_head_dim
    attn = 2 * local * tokens_each * ctx * heads * dim * arch.num_layers
    flops = 2 * active * tokens + attn
    peak = box.tflops(sh.compute_dtype) * 1e12 * float(eff["compute"])
    compute = flops / peak if peak else 0.0
    comm = _comm_s(arch, layout, box.link, tokens)
    return Step(memory, compute, comm, fixed_s(arch))


def fixed_s(arch: ModelArch) -> float:
    """A forward's cost beyond bytes, FLOPs and collectives: per step, and per layer by
    what the layer runs (MoE routing and grouped GEMMs, MLA's absorbed attention launch
    more kernels than a dense GQA layer)."""
    eff = defaults()["efficiency"]
    moe = len(arch.moe_layer_ids) if arch.is_moe else 0
    us = float(eff["step_overhead_us"]) + float(eff["layer_overhead_us"]) * arch.num_layers
    us += float(eff.get("moe_layer_overhead_us", 0)) * moe
    if arch.is_mla:
        us += float(eff.get("mla_layer_overhead_us", 0)) * arch.num_layers
    return us * 1e-6


def _comm_s(arch: ModelArch, layout: Layout, link: Link, tokens: int) -> float:
    """The collectives of one forward of ``tokens`` tokens on ``link``."""
    c = collectives(arch, layout)
    msg = tokens * arch.hidden_size * ACT_BYTES
    local = msg / max(1, layout.attn_dp)
    t = c.all_reduces * link.all_reduce_s(local, layout.tp)
    t += c.gathers * link.all_reduce_s(msg, layout.tp) / 2  # one half of an all-reduce
    per_rank = tokens / max(1, layout.ep) * arch.num_experts_per_tok * arch.hidden_size
    t += c.alltoalls * link.alltoall_s(per_rank * ACT_BYTES, layout.ep)
    return t


def draft_forward(arch: ModelArch, layout: Layout, sh: Shape, box: Box, *, requests: int,
                  tokens_each: int) -> float:
    """One forward of the draft: the checkpoint's MTP layer (NEXTN/EAGLE), or a separate
    EAGLE-3/standalone head of one layer; with its collectives (two per layer, the
    embedding's, the logits' gather) at the same TP."""
    eff = defaults()["efficiency"]
    tokens = requests * tokens_each
    if sh.draft_bytes:
        share = sh.expert_bytes / max(1, len(arch.moe_layer_ids)) if arch.is_moe else 0.0
        layer = (sh.draft_bytes - share) + share * _touched(arch, tokens) + sh.lm_head_bytes
    else:
        h = arch.hidden_size  # one decoder layer (~12 h^2), its fc (3h -> h), its head
        layer = (15 * h * h + EAGLE3_DRAFT_VOCAB * h) * 2 / layout.tp
    memory = layer / (box.gpu.bandwidth_gbs * 1e9)
    msg = tokens * arch.hidden_size * ACT_BYTES
    comm = 4 * box.link.all_reduce_s(msg, layout.tp) if layout.tp > 1 else 0.0
    overhead = 3 * float(eff["layer_overhead_us"]) * 1e-6
    return memory + comm + overhead


def prefill_s(arch: ModelArch, layout: Layout, sh: Shape, box: Box, input_len: int) -> float:
    """One request's prefill: its FLOPs (weights and causal attention) over the GPUs'
    dense tensor FLOPs, or its weight reads, plus its large collectives."""
    if input_len <= 0:
        return 0.0
    eff = defaults()["efficiency"]
    active = sh.dense_params + sh.expert_params * (
        arch.num_experts_per_tok / arch.n_routed_experts if arch.is_moe else 1.0)
    heads = max(1, arch.num_attention_heads // layout.attn_tp)
    dim = (arch.qk_nope_head_dim + arch.qk_rope_head_dim + arch.v_head_dim) if arch.is_mla \
        else arch.head_dim + arch.v_head_dim
    attn = 2 * input_len * min(input_len, arch.index_topk or input_len) * heads * dim \
        * arch.num_layers
    flops = 2 * active * input_len + attn
    peak = box.tflops(sh.compute_dtype) * 1e12 * float(eff["compute"])
    compute = flops / peak if peak else 0.0
    memory = (sh.dense_bytes + sh.expert_bytes) / (box.gpu.bandwidth_gbs * 1e9)
    comm = _comm_s(arch, layout, box.link, input_len)
    return max(compute, memory) + comm


def predict(arch: ModelArch, layout: Layout, box: Box, work: Workload, *,
            kv_dtype: str = "auto", spec: Speculation | None = None,
            parts: list | None = None) -> Prediction:
    """Single-stream and concurrency-N output tok/s of one launch (see the module doc);
    ``parts``: the checkpoint's weights per GPU where a scan read them."""
    sh = shape(arch, layout, kv_dtype, box.gpu.sm_major, parts)
    count = collectives(arch, layout)

    def rate(n: int) -> tuple[float, float, float, float | None]:
        """(output tok/s, seconds per step or cycle, of it collectives, accept length)."""
        b = max(1, min(n, work.max_running or n))
        context = work.input_len + work.output_len // 2
        if spec is None:
            step = forward(arch, layout, sh, box, requests=b, tokens_each=1, context=context)
            per_token, cycle, comm, gained = step.total_s, step.total_s, step.comm_s, None
        else:
            verify = forward(arch, layout, sh, box, requests=b,
                             tokens_each=spec.num_draft_tokens, context=context)
            drafts = spec.num_steps * draft_forward(
                arch, layout, sh, box, requests=b, tokens_each=spec.eagle_topk)
            gained = spec.acceptance()
            cpu = defaults()["speculation"]
            exposed = (float(cpu["cycle_cpu_us"]) + float(cpu["cycle_cpu_per_rank_us"])
                       * (layout.tp - 1)
                       + float(cpu.get("cycle_cpu_per_request_us", 0)) * b) * 1e-6
            cycle = verify.total_s + drafts + exposed
            per_token, comm = cycle / gained, verify.comm_s
        pre = 0.0 if work.decode_only else prefill_s(arch, layout, sh, box, work.input_len)
        out = work.output_len
        period = out * per_token + b * pre  # each running request prefills once per period
        return b * out / period / box.scale, cycle, comm, gained

    single, *_ = rate(1)
    tps, cycle, comm, gained = rate(work.concurrency)
    b = max(1, min(work.concurrency, work.max_running or work.concurrency))
    notes = []
    if not box.gpu.tflops:
        notes.append(f"{box.gpu.key}: no FLOPs in gpus.yaml, prefill and large batches "
                     "counted as memory-bound")
    return Prediction(
        single_stream_tps=single, output_tps=tps, per_user_tps=tps / b,
        concurrency=work.concurrency, step_ms=cycle * box.scale * 1e3,
        comm_ms=comm * box.scale * 1e3,
        prefill_ms=prefill_s(arch, layout, sh, box, work.input_len) * box.scale * 1e3,
        collectives_per_forward=count.total, accept_length=gained, link=box.link.name,
        notes=notes)
