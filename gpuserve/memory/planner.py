"""The memory planner: weights per GPU, KV bytes per token, KV tokens, verdict and fixes.

It follows SGLang's own accounting (0.5.23, 0.5.19 where it differs):

* ``mem_cache/kv_cache_configurator.py::_profile_available_bytes``:
  ``rest = avail_after_weights - pre_load_free * (1 - mem_fraction_static)``, all in GiB and
  the minimum over ranks. ``rest <= 0`` raises "Loaded weights leave no GPU memory for the KV
  cache ... minimum viable = 1 - available/pre"; the suggested value is that ceiled to 0.001.
* ``model_executor/pool_configurator.py::_compute_cell_size`` for bytes per token, and
  ``DefaultPoolConfigurator.calculate_pool_sizes``: ``tokens = rest_bytes // cell`` rounded
  down to the page size; ``tokens <= 0`` raises "Not enough memory" (MemoryPoolConfig).
* Default mem_fraction_static / cps / max_bs: ``gpuserve.memory.memory_defaults``.

Everything here takes plain numbers so it can be tested without profiles or hosts.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

from gpuserve.errors import InputError
from gpuserve.memory.memory_defaults import (
    DEFAULT_VERSION,
    MemoryDefaults,
    MemorySettings,
    memory_defaults,
)
from gpuserve.memory.models import ModelArch, component_modules
from gpuserve.terminal import signed_term

GIB = 1 << 30

# moe_a2a_backend values for which models/deepseek_v2.py builds the shared experts with
# parallel_group="replicated" (``_shared_expert_use_tp1``): a whole copy on every rank.
A2A_REPLICATE_SHARED = (
    "deepep",
    "deepep_v2",
    "pplx",
    "mooncake",
    "nixl",
    "mori",
    "ascend_fuseep",
    "flashinfer",
    "megamoe",
    "flashinfer_megamoe",
)
# Backends that force ep_size = tp_size (arg_groups/overrides.py::_a2a_ep_size).
A2A_FORCE_EP = A2A_REPLICATE_SHARED
KV_DTYPE_BYTES = {
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8": 1,
    "mxfp8": 1,
}
# Dispatch/combine workspace of an all-to-all MoE backend, GiB per GPU. Not computed by
# SGLang's memory hook (except deepep's 2 GiB reserve); this default is the residual of the
# GLM-5 NVFP4 TP-vs-EP field measurement (5.4 GiB less free under EP, 4.6 GiB of which is
# the replicated BF16 shared expert). Override with --a2a-buffer-gib.
DEFAULT_A2A_BUFFER_GIB = {"deepep": 2.0, "flashinfer": 0.8}
#: Speculative algorithms that draft with a model (its weights, KV and CUDA graphs); NGRAM
#: drafts from the prompt and has none.
DRAFTING = ("EAGLE", "EAGLE3", "STANDALONE", "NEXTN", "MTP")
#: The draft's CUDA graphs as a share of the target's decode-graph memory: two measured
#: startups agree on 0.39 (sglang#10088: "Capture cuda graph end ... mem usage=0.54 GB",
#: "Capture draft cuda graph end ... mem usage=0.21 GB"; sglang#30891, EAGLE3 on
#: Qwen3-30B-A3B FP8, B300: graph 1.19 GB, draft_graph 0.47 GB), rounded up.
DRAFT_GRAPH_SHARE = 0.4
#: Terms of SGLang's reserve that are padding, not memory anything needs: the 10 GiB
#: floor of large GPUs and 0.5.10.post1's flat 4/6 GiB for a draft. A draft's graphs and
#: pool overflow use that padding first (and are not counted twice).
RESERVE_PADDING = ("floor_10GiB", "speculative")
#: How the terms of sglang_need_mb read in a warning.
_NEED_LABELS = {"constant": "attention metadata", "parallel": "NCCL/cuBLAS workspaces",
                "cuda_graphs": "CUDA graphs", "deepep_buffers": "deepep buffers",
                "floor": "post-capture floor"}
#: Versions whose decode graph max bs flag is --cuda-graph-max-bs (decode_bs_flag).
_OLD_BS_FLAG = ("0.5.10.post1", "0.5.19")
#: SGLang's activation heuristic, MiB per chunked-prefill token (memory_hook.py: "The
#: coefficient 1.5 is a heuristic value"), and the figure the planner holds a launch to:
#: the notes' GLM-5 NVFP4 TP8 start at mem_fraction_static 0.92 ran with 7.52 GiB free
#: after the pool (94 GB x 0.08), decode graphs to bs 128 and 8192-token chunks, which
#: bounds the activations there at (7.52 - 3.25 GiB of the other terms) / 8192 = 0.53
#: MiB/token; a public guide's 0.92 start of another export on the same GPUs had
#: 7.43-7.53 GB free. How: docs/planner.md, "What must fit outside the static pool".
SGLANG_ACTIVATION_MIB_PER_TOKEN = 1.5
ACTIVATION_MIB_PER_TOKEN = 0.5


class UnsupportedKvDtype(InputError, ValueError):
    """A KV cache dtype the planner cannot size (also a ValueError, as it used to be, for
    the callers that catch that). Why an InputError: ``gpuserve plan --kv-cache-dtype
    nvfp4`` on a GQA model, or any unknown name, ended in a traceback."""


# ------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Layout:
    """How the model is spread over the GPUs of one replica."""

    tp: int = 1
    ep: int = 1
    attn_dp: int = 1
    pp: int = 1
    moe_a2a_backend: str = "none"
    num_redundant_experts: int = 0
    speculative: str | None = None  # NEXTN/EAGLE/MTP -> the checkpoint's MTP layers load too
    draft_layers: int | None = None  # override the number of draft (MTP/EAGLE) layers
    dp_lm_head: bool = False  # --enable-dp-lm-head
    # PD role (--disaggregation-mode): null, prefill or decode (memory_defaults' reserve)
    disaggregation_mode: str = "null"
    num_draft_tokens: int | None = None  # --speculative-num-draft-tokens as given

    @property
    def attn_tp(self) -> int:
        return max(1, self.tp // self.attn_dp)

    @property
    def moe_tp(self) -> int:
        return max(1, self.tp // self.ep)

    def validate(self, arch: ModelArch | None = None) -> list[str]:
        """Problems SGLang would refuse at launch (runtime_context.py, parallel_hook.py)."""
        errs = []
        if self.tp % self.ep:
            errs.append(f"ep ({self.ep}) must divide tp ({self.tp}): tp = ep x moe_dp x moe_tp")
        if self.tp % self.attn_dp:
            errs.append(f"attn_dp ({self.attn_dp}) must divide tp ({self.tp})")
        if arch is not None:
            errs += heads_problems(arch, self)
        if self.moe_a2a_backend in A2A_FORCE_EP and self.ep != self.tp:
            errs.append(
                f"--moe-a2a-backend {self.moe_a2a_backend} forces ep_size = tp_size ({self.tp})"
            )
        q = arch.quantization if arch is not None else None
        if arch is not None and arch.is_moe and q is not None and len(q.weight_block_size) == 2:
            # layers/quantization/fp8.py (Fp8MoEMethod.create_weights): block-wise fp8 experts
            # need intermediate_size_per_partition divisible by block_n (and block_k if tp > 1)
            per_part = arch.moe_intermediate_size // self.moe_tp
            if per_part % q.weight_block_size[0] or (
                self.moe_tp > 1 and per_part % q.weight_block_size[1]
            ):
                errs.append(
                    f"moe_intermediate_size {arch.moe_intermediate_size} / moe_tp {self.moe_tp} = "
                    f"{per_part} is not divisible by the fp8 block {q.weight_block_size[0]}: "
                    f"SGLang refuses to load; use --ep {self.tp} (whole experts)"
                )
        if arch is not None and arch.is_moe and self.ep > 1:
            total = arch.n_routed_experts + self.num_redundant_experts
            if total % self.ep:
                errs.append(
                    f"{total} experts (routed + redundant) do not split evenly over ep={self.ep}"
                )
        return errs


def heads_problems(arch: ModelArch, layout: Layout) -> list[str]:
    """The attention heads that do not split over the attention TP group, as SGLang 0.5.23
    asserts when it builds the attention layers (sglang/srt/models/llama.py:183
    ``total_num_heads % tp_size == 0``; 186-193: KV heads divide tp_size, or tp_size is a
    multiple of them when they are fewer (replicated); MLA: models/deepseek_v2.py:2057
    ``num_heads % attn_tp_size == 0``). The group is tp / attention-DP
    (arg_groups/parallel_hook.py:163 requires tp_size divisible by attn_dp_size).

    The vocabulary needs no check: VocabParallelEmbedding pads it to a multiple of the TP
    size when it does not divide (layers/vocab_parallel_embedding.py:272-274)."""
    attn_tp = layout.attn_tp
    if attn_tp <= 1 or layout.tp % layout.attn_dp:
        return []
    where = f"--tp {layout.tp} (tp_size)" + (
        f" / --attn-dp {layout.attn_dp} = attention TP {attn_tp}" if layout.attn_dp > 1 else "")
    heads, kv = arch.num_attention_heads, arch.num_kv_heads
    errs = []
    if heads % attn_tp:
        errs.append(
            f"{where}: {arch.name}'s num_attention_heads {heads} do not split over {attn_tp} "
            f"ranks ({heads} % {attn_tp} = {heads % attn_tp}); SGLang refuses to load it")
    if not arch.is_mla and kv and (kv % attn_tp if kv >= attn_tp else attn_tp % kv):
        rule = f"{kv} % {attn_tp} = {kv % attn_tp}" if kv >= attn_tp else \
            f"{attn_tp} is not a multiple of {kv}"
        errs.append(
            f"{where}: {arch.name}'s num_key_value_heads {kv} do not split over {attn_tp} "
            f"ranks ({rule}); SGLang refuses to load it")
    return errs


# ------------------------------------------------------------------------- weights


def _bytes_per_param(arch: ModelArch, kind: str, module: str) -> float:
    q = arch.quantization
    if q is None or kind in ("embed", "lm_head", "router", "norm") or not q.quantizes(module):
        return float(arch.dtype_bytes)
    return q.bytes_per_param


@dataclass
class WeightPart:
    name: str
    params_per_gpu: float
    bytes_per_param: float
    how: str  # "sharded /N", "replicated", ...

    @property
    def gib(self) -> float:
        return self.params_per_gpu * self.bytes_per_param / GIB


# Components a GPU holds whole (replicated) rather than a slice of.
REPLICATED_KINDS = ("attention_replicated", "indexer", "norm", "router", "mtp_extra", "other")


def shard(kind: str, layout: Layout, arch: ModelArch) -> tuple[float, str]:
    """The share of a component's whole-model weights one GPU holds, and how (a label).

    One table of SGLang's sharding rules, used by the record path (weights_per_gpu) and the
    checkpoint path (gpuserve.memory.checkpoint), so the two cannot drift apart:

    * embedding: vocab-parallel over tp; under attention DP over the attention-TP group only
      (layers/vocab_parallel_embedding.py::get_embedding_tp_kwargs); the LM head does so only
      with --enable-dp-lm-head (ParallelLMHead use_attn_tp_group);
    * attention: /attn_tp (attn_tp = tp / attn_dp, so attention DP replicates it); K/V
      projections of GQA are replicated once attn_tp exceeds the KV heads (QKVParallelLinear);
      MLA's q_a/kv_a down-projections and their norms are ReplicatedLinear;
    * DSA indexer, norms, router: replicated;
    * routed experts: EP gives each rank (routed + redundant)/ep whole experts, sharded again
      by moe_tp = tp/ep; shared experts are replicated under all-to-all backends
      (models/deepseek_v2.py::_shared_expert_use_tp1), else /tp; dense MLP /tp.
    """
    tp = layout.tp
    if kind == "embed":
        div = layout.attn_tp if layout.attn_dp > 1 else tp
        return 1 / div, f"vocab-parallel /{div}"
    if kind == "lm_head":
        div = layout.attn_tp if layout.dp_lm_head else tp
        return 1 / div, f"vocab-parallel /{div}"
    if kind == "attention":
        return 1 / layout.attn_tp, f"/{layout.attn_tp} (attn_tp)"
    if kind == "attention_kv":
        kv = max(1, arch.num_kv_heads)
        return max(1, kv // layout.attn_tp) / kv, f"/{layout.attn_tp} (attn_tp)"
    if kind == "dense_mlp":
        return 1 / tp, f"/{tp}"
    if kind == "routed_experts":
        n = max(1, arch.n_routed_experts)
        here = (n + layout.num_redundant_experts) / layout.ep
        how = (
            f"{here:g} whole experts/GPU (ep {layout.ep})"
            if layout.ep > 1
            else f"all {n} experts /{tp}"
        )
        if layout.ep > 1 and layout.moe_tp > 1:
            how += f" /{layout.moe_tp} (moe_tp)"
        return here / n / layout.moe_tp, how
    if kind == "shared_experts":
        if layout.moe_a2a_backend in A2A_REPLICATE_SHARED:
            return 1.0, f"replicated ({layout.moe_a2a_backend} a2a)"
        return 1 / tp, f"/{tp}"
    return 1.0, "replicated"


def _attention_params(arch: ModelArch) -> tuple[float, float, float]:
    """(sharded, K/V, replicated) attention parameters of one layer, whole model."""
    h = arch.hidden_size
    if arch.is_mla:
        heads = arch.num_attention_heads
        qk = arch.qk_nope_head_dim + arch.qk_rope_head_dim
        rep = h * (arch.kv_lora_rank + arch.qk_rope_head_dim) + arch.kv_lora_rank
        if arch.q_lora_rank:
            rep += h * arch.q_lora_rank + arch.q_lora_rank  # fused q_a/kv_a (ReplicatedLinear)
            sharded = arch.q_lora_rank * heads * qk
        else:
            sharded = h * heads * qk
        sharded += arch.kv_lora_rank * heads * (arch.qk_nope_head_dim + arch.v_head_dim)
        sharded += heads * arch.v_head_dim * h  # o_proj
        return sharded, 0.0, rep
    heads = arch.num_attention_heads
    sharded = h * heads * arch.head_dim + heads * arch.head_dim * h
    return sharded, 2 * h * arch.num_kv_heads * arch.head_dim, 0.0


def _indexer_params(arch: ModelArch) -> float:
    """Lightning indexer of one DSA layer (wq_b, wk, weights_proj, k_norm); replicated."""
    if arch.attention != "dsa":
        return 0.0
    q_in = arch.q_lora_rank or arch.hidden_size
    return (
        q_in * arch.index_n_heads * arch.index_head_dim
        + arch.hidden_size * arch.index_head_dim
        + arch.hidden_size * arch.index_n_heads
        + 2 * arch.index_head_dim
    )


def weights_per_gpu(arch: ModelArch, layout: Layout) -> list[WeightPart]:
    """Weight bytes resident on one GPU, by component, from the record's config: whole-model
    parameters per component times its ``shard`` share (SGLang's sharding rules)."""
    mods = component_modules(arch)
    h = arch.hidden_size
    parts: list[WeightPart] = []

    def add(kind: str, name: str, whole: float) -> None:
        share, how = shard(kind, layout, arch)
        if whole:
            bpp = _bytes_per_param(arch, kind, mods.get(kind, kind))
            parts.append(WeightPart(name, whole * share, bpp, how))

    vocab = arch.vocab_size * h
    add("embed", "embedding", vocab)
    if not arch.tie_word_embeddings:
        add("lm_head", "lm_head", vocab)

    sharded, kv, rep = _attention_params(arch)
    n = arch.num_layers
    attn_share, attn_how = shard("attention", layout, arch)
    kv_share, _ = shard("attention_kv", layout, arch)
    per_gpu = (sharded * attn_share + kv * kv_share) * n
    if per_gpu:
        bpp = _bytes_per_param(arch, "attention", mods["attention"])
        parts.append(WeightPart("attention (sharded)", per_gpu, bpp, attn_how))
    mods["attention_replicated"] = mods["attention"]
    add("attention_replicated", "attention (replicated)", rep * n)
    add("indexer", "DSA indexer", _indexer_params(arch) * len(arch.index_layer_ids))
    add("norm", "norms", 2 * h * n + h)

    dense = len(arch.dense_layer_ids)
    if arch.intermediate_size and dense:
        add("dense_mlp", f"dense MLP x{dense}", 3 * h * arch.intermediate_size * dense)

    moe = len(arch.moe_layer_ids)
    if arch.is_moe:
        per_expert = 3 * h * arch.moe_intermediate_size
        add("routed_experts", f"routed experts x{moe} layers",
            per_expert * arch.n_routed_experts * moe)
        add("router", "router", h * arch.n_routed_experts * moe)
        shared_inter = (
            arch.moe_intermediate_size * arch.n_shared_experts
            or arch.shared_expert_intermediate_size
        )
        if shared_inter:
            add("shared_experts", "shared experts", 3 * h * shared_inter * moe)

    draft = draft_layers(arch, layout) if uses_builtin_mtp(arch, layout) else 0
    if draft:
        parts.append(_draft_part(arch, parts, mods, draft, moe=moe, dense=dense))
    return parts


def _draft_part(arch: ModelArch, parts: list[WeightPart], mods: dict, draft: int, *,
                moe: int, dense: int) -> WeightPart:
    """The checkpoint's own MTP layers used as the draft: ``draft`` layers, each the size
    of one target layer (from the target's ``parts``) plus its eh_proj."""
    h = arch.hidden_size
    n = arch.num_layers
    # One decoder layer per MTP step plus eh_proj (2h -> h); embedding and lm_head are
    # shared with the target (speculative EAGLE worker set_embed_and_head).
    per_layer = (
        sum(
            p.params_per_gpu * p.bytes_per_param
            for p in parts
            if p.name.startswith(("attention", "DSA", "norms"))
        )
        / n
    )
    if arch.is_moe:
        per_layer += (
            sum(
                p.params_per_gpu * p.bytes_per_param
                for p in parts
                if p.name.startswith(("routed", "router", "shared"))
            )
            / moe
        )
    elif dense:
        per_layer += (
            sum(
                p.params_per_gpu * p.bytes_per_param
                for p in parts
                if p.name.startswith("dense")
            )
            / dense
        )
    bpp = _bytes_per_param(arch, "mtp", mods.get("mtp", "mtp"))
    eh = 2 * h * h * arch.dtype_bytes
    return WeightPart(
        f"draft/MTP layers x{draft}",
        (per_layer + eh) * draft / bpp,
        bpp,
        "like one target layer",
    )


def uses_builtin_mtp(arch: ModelArch, layout: Layout) -> bool:
    """Drafting with the checkpoint's own MTP layers (their weights load with the target)."""
    algo = (layout.speculative or "").upper()
    return (
        bool(arch.mtp_layers) and layout.draft_layers is None and algo in ("NEXTN", "MTP", "EAGLE")
    )


def draft_layers(arch: ModelArch, layout: Layout) -> int:
    """Draft layers whose KV the target pool also holds (pool_configurator.py adds
    cell x draft_layers / L for EAGLE/STANDALONE). NEXTN/MTP, and EAGLE on a checkpoint with
    built-in MTP layers, draft with those layers; EAGLE3/STANDALONE heads have one layer."""
    if layout.draft_layers is not None:
        return layout.draft_layers
    algo = (layout.speculative or "").upper()
    if not algo or algo == "NGRAM":
        return 0
    if algo in ("NEXTN", "MTP") or (algo == "EAGLE" and arch.mtp_layers):
        return arch.mtp_layers
    return 1


# ------------------------------------------------------------------------- KV cache


def resolve_kv_dtype(arch: ModelArch, kv_cache_dtype: str = "auto") -> str:
    """SGLang's "auto": fp8 when the checkpoint says kv_cache_quant_algo FP8, else the model
    dtype (mem_cache/kv_cache_dtype.py::configure_kv_cache_dtype)."""
    if kv_cache_dtype in (None, "", "auto"):
        q = arch.quantization
        if q and q.kv_cache_quant_algo and q.kv_cache_quant_algo.upper() == "FP8":
            return "fp8_e4m3"
        return "bf16" if arch.dtype_bytes == 2 else arch.dtype
    return kv_cache_dtype


def dsa_uses_raw_layout(
    arch: ModelArch, kv_dtype: str, sm_major: int | None, dsa_backend: str | None = None
) -> bool:
    """Whether the DSA pool stores the raw MLA row (trtllm/tilelang) instead of the scaled fp8
    layout. Defaults from arg_groups/overrides.py::_dsa_split_backend_resolution (0.5.23):
    GLM on SM12x with fp8 KV -> flashinfer_sparse_mla (scaled); other fp8 -> trtllm if
    major >= 10 else flashmla_kv; bf16 -> decode trtllm if major >= 10 (raw)."""
    if dsa_backend:
        return dsa_backend in ("trtllm", "tilelang")
    if sm_major is None:
        return False
    if kv_dtype.startswith("fp8"):
        if arch.architecture == "GlmMoeDsaForCausalLM" and sm_major == 12:
            return False
        return sm_major >= 10
    return sm_major >= 10


@dataclass
class KvCell:
    bytes_per_token: int
    target_bytes: int
    indexer_bytes: int
    draft_bytes: int
    formula: str


def kv_cell(
    arch: ModelArch,
    *,
    kv_dtype: str,
    attn_tp: int = 1,
    draft: int = 0,
    sm_major: int | None = None,
    dsa_backend: str | None = None,
) -> KvCell:
    """Per-token KV bytes on one GPU (pool_configurator.py::_compute_cell_size)."""
    fp4 = kv_dtype in ("nvfp4", "fp4_e2m1")
    e = 1 if (fp4 and arch.is_mla) else KV_DTYPE_BYTES.get(kv_dtype)
    if e is None:
        # FP4 KV for MHA/GQA is sized by a per-recipe quant method; not modelled here.
        raise UnsupportedKvDtype(None, "kv_cache_dtype", f"{kv_dtype!r} is not modelled for "
                                 f"{arch.attention.upper()} attention (known: "
                                 f"{', '.join(sorted(KV_DTYPE_BYTES))}, and nvfp4/fp4_e2m1 "
                                 "for MLA)")
    n = arch.num_layers
    indexer = 0
    if arch.is_mla:
        dim = arch.kv_lora_rank + arch.qk_rope_head_dim
        desc = f"MLA ({arch.kv_lora_rank}+{arch.qk_rope_head_dim})"
        if (
            arch.attention == "dsa"
            and kv_dtype.startswith("fp8")
            and not dsa_uses_raw_layout(arch, kv_dtype, sm_major, dsa_backend)
        ):
            # kv_cache_configurator.py::calculate_mla_kv_cache_dim: fp8 nope + fp32 scale per
            # 128 + bf16 rope
            dim = arch.kv_lora_rank + arch.kv_lora_rank // 128 * 4 + arch.qk_rope_head_dim * 2
            desc = f"DSA fp8 scaled row ({dim} B)"
        per_layer = dim * e
        if fp4:
            # float4_e2m1fn_x2 (1 B holds 2 values): cell // 2 plus one scale byte per 16
            per_layer = dim // 2 + (arch.kv_lora_rank + arch.qk_rope_head_dim) // 16
            desc = f"MLA fp4 ({dim}/2 + {dim // 16} scale B)"
        target = per_layer * n
        desc += f" x {n} layers{'' if fp4 else f' x {e} B'}, not split by TP"
        if arch.attention == "dsa":
            # _compute_dsa_indexer_cell_size: fp8 index K + fp32 scale per 128, uint8 buffer
            idx = arch.index_head_dim + arch.index_head_dim // 128 * 4
            indexer = idx * len(arch.index_layer_ids)
            desc += f" + indexer {idx} B x {len(arch.index_layer_ids)} layers"
        draft_bytes = int(target * draft / n) + (
            (arch.index_head_dim + arch.index_head_dim // 128 * 4) * draft
            if arch.attention == "dsa"
            else 0
        )
    else:
        heads = max(1, arch.num_kv_heads // attn_tp)
        target = heads * (arch.head_dim + arch.v_head_dim) * n * e
        desc = f"{heads} KV heads x ({arch.head_dim}+{arch.v_head_dim}) x {n} layers x {e} B"
        if kv_dtype == "mxfp8":  # one e8m0 scale per 32 values
            target += heads * (arch.head_dim + arch.v_head_dim) * n // 32
            desc += " + mxfp8 scales"
        draft_bytes = int(target * draft / n)
    if draft:
        desc += f" + {draft} draft layer(s)"
    return KvCell(target + indexer + draft_bytes, target, indexer, draft_bytes, desc)


# ------------------------------------------------------------------------- budget


@dataclass
class Budget:
    """The arithmetic of _profile_available_bytes for one set of figures (GiB)."""

    pre_load_free_gib: float
    avail_after_weights_gib: float
    mem_fraction_static: float
    slack_gib: float
    rest_gib: float
    min_viable_mfs: float
    suggested_mfs: float
    kv_tokens: int | None
    cell_bytes: int | None

    @property
    def refused(self) -> bool:
        return self.rest_gib <= 0


def budget(
    pre_load_free_gib: float,
    avail_after_weights_gib: float,
    mem_fraction_static: float,
    cell_bytes: int | None = None,
    page_size: int = 1,
    fixed_overhead_gib: float = 0.0,
) -> Budget:
    """rest = avail_after - pre * (1 - mfs); tokens = rest_bytes // cell (page-aligned)."""
    slack = pre_load_free_gib * (1 - mem_fraction_static)
    rest = avail_after_weights_gib - slack
    min_viable = 1 - avail_after_weights_gib / pre_load_free_gib
    suggested = math.ceil(min_viable * 1000) / 1000
    tokens = None
    if cell_bytes and rest > 0:
        avail_bytes = max(int(rest * GIB) - int(fixed_overhead_gib * GIB), 0)
        tokens = avail_bytes // cell_bytes // page_size * page_size
    return Budget(
        pre_load_free_gib,
        avail_after_weights_gib,
        mem_fraction_static,
        slack,
        rest,
        min_viable,
        suggested,
        tokens,
        cell_bytes,
    )


def resolve_max_running_requests(
    tokens: int, context_len: int, requested: int | None = None, attn_dp: int = 1
) -> int:
    """Per-DP-worker request cap (kv_cache_configurator.py::resolve_max_num_reqs, no Mamba):
    min(clamp(tokens / context_len * 512, 2048, 4096), tokens // 2), or the user's value
    split over attention-DP workers, still capped at tokens // 2."""
    if requested is not None:
        return min(max(1, requested // attn_dp), tokens // 2)
    estimated = max(min(int(tokens / context_len * 512), 4096), 2048)
    return min(estimated, tokens // 2)


def mfs_for_tokens(pre: float, avail_after: float, tokens: int, cell_bytes: int) -> float:
    """Smallest mem_fraction_static that leaves room for ``tokens`` KV tokens."""
    need = tokens * cell_bytes / GIB
    return math.ceil((1 - (avail_after - need) / pre) * 1000) / 1000


# ------------------------------------------------------------------------- predict


class FitVerdict(StrEnum):
    """The planner's verdict on a launch (a StrEnum: output and records keep the word)."""

    FITS = "fits"
    TIGHT = "tight"  # a KV pool, smaller than the context
    # measurements disagree about this launch, or its calibrated margin lies inside the
    # calibration's error: it may start or stop (gpuserve.memory.calibration); goes ahead
    # with a warning
    RISKY = "risky"
    REFUSED = "refused"  # SGLang raises: the weights leave no memory for the KV cache
    NO_KV = "no-kv"  # SGLang raises: not enough memory for one KV token
    INVALID = "invalid"  # a layout SGLang refuses
    TOO_FEW_GPUS = "too-few-gpus"  # the preflight's: the host has fewer GPUs than needed
    NO_GPUS = "no-gpus"  # the preflight's: the host shows no GPU

    @property
    def starts(self) -> bool:
        """Whether SGLang would size a KV pool and start."""
        return self in (FitVerdict.FITS, FitVerdict.TIGHT)


@dataclass
class Plan:
    model: str
    gpu: str
    gpus: int
    version: str
    layout: dict
    defaults: dict
    mem_fraction_static: float
    kv_dtype: str
    weights: list[dict]
    weights_gib: float
    a2a_buffer_gib: float
    pre_load_free_gib: float
    avail_after_weights_gib: float
    kv_cell: dict
    rest_gib: float
    kv_tokens: int
    kv_gib: float
    context_length: int | None
    max_running_requests: int | None
    graph_reserve_gib: float
    verdict: FitVerdict
    min_viable_mfs: float
    max_safe_mfs: float
    explanation: list[str]
    changes: list[str]
    problems: list[str] = field(default_factory=list)
    weights_from: str = "model record"  # or "checkpoint <dir>" (safetensors headers)
    draft: dict | None = None  # what speculation adds (DraftCharge), None without it
    # real starts of the model on this GPU carried to this launch (gpuserve.memory.
    # calibration.RecordEstimate dicts), and the plan from a host's measured start
    measured: list[dict] = field(default_factory=list)
    calibrated: dict | None = None

    def to_dict(self) -> dict:
        """The plan as JSON; a plan calibrated by a host's measured start shows the
        calibrated figures at the top and the record's own under ``planned``."""
        out = asdict(self)
        c = self.calibrated
        if c:
            out["planned"] = {key: out[key] for key in _CALIBRATED_KEYS}
            out.update({key: c[source] for key, source in _CALIBRATED_KEYS.items()})
        return out


#: the top-level figures a calibrated plan replaces: plan key -> calibrated key
_CALIBRATED_KEYS = {"pre_load_free_gib": "free_before_weights_gib",
                    "avail_after_weights_gib": "free_after_weights_gib",
                    "rest_gib": "rest_gib", "kv_tokens": "kv_tokens",
                    "min_viable_mfs": "min_viable_mfs"}


@dataclass
class _Sizing:
    """The figures of one predicted launch, in the order SGLang arrives at them (GiB), with
    the GPU facts they came from.

    ``predict`` computes them once and the explanation, verdict, fixes and Plan all read
    them, so each of those steps can be followed (and tested) on its own.
    """

    gpu_memory_mib: float
    sm_major: int | None
    dsa_backend: str | None
    defaults: MemoryDefaults  # as launched: the user's mem_fraction_static when given
    heuristic: MemoryDefaults  # SGLang's own choice at the same settings (its reserve)
    mfs: float
    kv_dtype: str
    parts: list[WeightPart]
    weights: float
    a2a_buffer_gib: float
    pre: float
    after: float
    cell: KvCell
    budget: Budget
    tokens: int
    ctx: int | None
    graph_reserve: float  # sglang_need_mb in GiB: what must fit outside the static pool
    max_safe: float
    draft: DraftCharge | None = None


@dataclass
class DraftCharge:
    """What a drafting speculative launch adds on one GPU (GiB unless named): the separate
    draft's weights (already in the weights), the KV SGLang budgets for the draft and what
    its real pool takes beyond that, its CUDA graphs, and the room left outside the static
    pool once SGLang's own graphs and activations are in it."""

    algorithm: str
    model: str | None  # the separate draft's name; None: built-in MTP layers or unknown
    source: str  # "checkpoint <dir>", "record <name>", "target's MTP layers", "unknown"
    weights_gib: float | None  # None: a separate draft nobody described
    weights_error_gib: float | None  # what the weights may still be off by (None: unknown)
    kv_layers: int
    kv_budget_bytes: int  # per token, SGLang's share in the cell (target cell x layers / L)
    kv_real_bytes: int | None  # per token, the draft's own pool geometry
    kv_extra_gib: float  # (real - budget) x tokens, taken outside the static pool
    graphs_gib: float
    outside_pool_gib: float  # G x (1 - mem_fraction_static)
    sglang_need_gib: float  # SGLang's reserve less its padding
    room_gib: float  # max(0, outside - need) - draft graphs - KV extra

    def to_dict(self) -> dict:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class PlanRequest:
    """What :func:`predict` is asked: the GPUs, the launch's settings and where its weights
    come from (one value: the CLI, the preflight, the doctor and the tuner fill it alike).

    ``weight_parts`` replaces the weights computed from the architecture (e.g. those of
    the real checkpoint, gpuserve.memory.checkpoint.checkpoint_weights), ``weights_from``
    says where they came from, and ``record`` (the model record a profile names) is
    compared with them: a difference above 5% becomes a note with both figures.
    ``draft`` is a separate draft model (a gpuserve.memory.draft.Draft): its weights, KV
    layers and pool are charged."""

    gpu_memory_mib: float
    gpu_name: str = ""
    gpu_count: int = 1
    sm_major: int | None = None
    init_overhead_gib: float = 2.0
    layout: Layout | None = None
    version: str = DEFAULT_VERSION
    mem_fraction_static: float | None = None
    kv_cache_dtype: str = "auto"
    cuda_graph_max_bs: int | None = None
    chunked_prefill_size: int | None = None
    max_running_requests: int | None = None
    context_length: int | None = None
    pre_load_free_gib: float | None = None
    a2a_buffer_gib: float | None = None
    dsa_backend: str | None = None
    page_size: int = 1
    draft_weights_gib: float = 0.0
    weight_parts: list[WeightPart] | None = None
    weights_from: str | None = None
    record: ModelArch | None = None
    draft: Any = None


def predict(arch: ModelArch, request: PlanRequest) -> Plan:
    """Predict a launch: SGLang's defaults, weights, KV capacity and a verdict with fixes
    (``request``: :class:`PlanRequest`)."""
    r = request
    layout = r.layout or Layout()
    if r.draft is not None:
        layout = replace(layout, draft_layers=r.draft.kv_layers)
    problems = _layout_problems(arch, layout, r.gpu_count)
    defaults, heuristic = _launch_defaults(arch, layout, r)
    s = _size_launch(arch, layout, defaults, heuristic, r)
    verdict, explanation, changes = _judged(
        arch, layout, s, problems, version=r.version, draft_weights_gib=r.draft_weights_gib,
        record=r.record if r.weight_parts is not None else None)
    plan = _plan(arch, layout, s, r, verdict=verdict, explanation=explanation,
                 changes=changes, problems=problems)
    if r.weight_parts is not None:
        plan.weights_from = r.weights_from or "checkpoint"
    if s.draft is not None:
        plan.draft = s.draft.to_dict()
    return plan


def _judged(arch: ModelArch, layout: Layout, s: _Sizing, problems: list[str], *,
            version: str, draft_weights_gib: float, record: ModelArch | None
            ) -> tuple[str, list[str], list[str]]:
    """The verdict on a sized launch, the lines that explain it (the budget, the record's
    notes, its disagreement with the checkpoint's weights when ``record`` is given) and
    the changes that would fix it."""
    explanation = _budget_lines(s, version)
    explanation += _draft_lines(s)
    known = s.draft is not None and s.draft.weights_gib is not None
    explanation += _record_notes(arch, layout, draft_weights_gib or known)
    if record is not None:
        explanation += record_disagreement(record, layout, s.weights - draft_weights_gib)
    verdict, verdict_lines = _verdict(problems, s)
    explanation += verdict_lines
    changes = _changes_for_verdict(arch, layout, s, verdict)
    changes += _draft_changes(arch, layout, s, verdict)
    return verdict, explanation, changes


def record_disagreement(record: ModelArch, layout: Layout, weights_gib: float) -> list[str]:
    """A note when the model record's weights per GPU differ from the checkpoint's by more
    than 5%: the record (a reconstructed config) has drifted from the real export."""
    expected = sum(p.gib for p in weights_per_gpu(record, layout))
    if weights_gib <= 0 or abs(expected - weights_gib) / weights_gib <= 0.05:
        return []
    return [
        f"model record {record.name} predicts {expected:.2f} GiB/GPU of weights, the checkpoint "
        f"holds {weights_gib:.2f} GiB/GPU ({(expected - weights_gib) / weights_gib:+.1%}): "
        "the record disagrees with the real checkpoint; the checkpoint's figure is used"
    ]


def _layout_problems(arch: ModelArch, layout: Layout, gpu_count: int) -> list[str]:
    """What SGLang would refuse at launch, plus a layout that needs more GPUs than given.

    Any problem makes the verdict "invalid"; the figures are still computed and shown.
    """
    problems = layout.validate(arch)
    if layout.tp * layout.pp > gpu_count:
        problems.append(f"tp x pp = {layout.tp * layout.pp} needs more than {gpu_count} GPUs")
    return problems


def _launch_defaults(arch: ModelArch, layout: Layout, request: PlanRequest
                     ) -> tuple[MemoryDefaults, MemoryDefaults]:
    """SGLang's defaults as launched, and its own heuristic at the same settings.

    The two differ only when the user sets mem_fraction_static; the heuristic's reserve,
    less its padding (sglang_need_mb), is what SGLang allocates outside the static pool at
    these settings, so it bounds a safe fraction.
    """
    gpu_memory_mib, mem_fraction_static = request.gpu_memory_mib, request.mem_fraction_static
    settings = dict(
        tp=layout.tp,
        pp=layout.pp,
        attn_dp=layout.attn_dp,
        use_mla=arch.is_mla,
        version=request.version,
        chunked_prefill_size=request.chunked_prefill_size,
        decode_max_bs=request.cuda_graph_max_bs,
        max_running_requests=request.max_running_requests,
        moe_a2a_backend=layout.moe_a2a_backend,
        speculative=bool(layout.speculative),
        speculative_algorithm=layout.speculative,
        disaggregation_mode=layout.disaggregation_mode,
        num_draft_tokens=layout.num_draft_tokens,
    )
    defaults = memory_defaults(gpu_memory_mib, MemorySettings(
        mem_fraction_static=mem_fraction_static, **settings))
    # The reserve SGLang's heuristic would keep at these settings, by cause: sglang_need_mb
    # reads what graphs and activations really take from it, even when the user sets it.
    heuristic = (
        defaults if mem_fraction_static is None
        else memory_defaults(gpu_memory_mib, MemorySettings(**settings))
    )
    return defaults, heuristic


def _size_launch(arch: ModelArch, layout: Layout, defaults: MemoryDefaults,
                 heuristic: MemoryDefaults, request: PlanRequest) -> _Sizing:
    """Follow SGLang's startup: weights load, then _profile_available_bytes sizes the pool.

    free before weights -> minus weights and a2a buffers -> rest after the static-pool slack
    -> KV tokens at the per-token cell size.
    """
    r, mfs = request, defaults.mem_fraction_static
    gpu_memory_mib, sm_major, dsa_backend, draft = (r.gpu_memory_mib, r.sm_major,
                                                    r.dsa_backend, r.draft)
    kv_dtype = resolve_kv_dtype(arch, r.kv_cache_dtype)
    parts = _weight_parts(arch, layout, r.draft_weights_gib, r.weight_parts)
    if draft is not None:
        parts += list(draft.weights)
    weights = sum(p.gib for p in parts)
    a2a_buffer_gib = r.a2a_buffer_gib
    if a2a_buffer_gib is None:
        a2a_buffer_gib = DEFAULT_A2A_BUFFER_GIB.get(layout.moe_a2a_backend, 0.0)
    pre = _pre_load_free(gpu_memory_mib, r.init_overhead_gib, r.pre_load_free_gib)
    after = pre - weights - a2a_buffer_gib
    cell = kv_cell(
        arch,
        kv_dtype=kv_dtype,
        attn_tp=layout.attn_tp,
        draft=draft_layers(arch, layout),
        sm_major=sm_major,
        dsa_backend=dsa_backend,
    )
    b = budget(pre, after, mfs, cell.bytes_per_token, r.page_size)
    need = _sglang_need_gib(heuristic)
    charge = _draft_charge(arch, layout, heuristic, r, pre=pre, mfs=mfs, cell=cell,
                           tokens=b.kv_tokens or 0)
    return _Sizing(
        gpu_memory_mib=gpu_memory_mib,
        sm_major=sm_major,
        dsa_backend=dsa_backend,
        defaults=defaults,
        heuristic=heuristic,
        mfs=mfs,
        kv_dtype=kv_dtype,
        parts=parts,
        weights=weights,
        a2a_buffer_gib=a2a_buffer_gib,
        pre=pre,
        after=after,
        cell=cell,
        budget=b,
        tokens=b.kv_tokens or 0,
        ctx=r.context_length or arch.max_position_embeddings,
        graph_reserve=need,
        max_safe=_max_safe_mfs(pre, need),
        draft=charge,
    )


def _draft_charge(arch: ModelArch, layout: Layout, heuristic: MemoryDefaults,
                  request: PlanRequest, *, pre: float, mfs: float, cell: KvCell,
                  tokens: int) -> DraftCharge | None:
    """What speculation adds, None when it drafts with no model (NGRAM) or is off.

    The draft's KV inside the cell is SGLang's own budget (pool_configurator.py scales the
    target's cell by 1 + draft layers / L); the draft worker then allocates its pool with
    its own heads for the same tokens (scheduler.py init_memory_pools hands it the
    target's MemoryPoolConfig), so a wider draft takes the difference from the memory
    outside the static pool, where its CUDA graphs are captured too. Its KV dtype is the
    launch's, "auto" resolved for the draft's own checkpoint (an FP8-KV target's draft
    without that quantization keeps its model dtype: configure_kv_cache_dtype runs per
    model runner)."""
    algo = (layout.speculative or "").upper()
    if algo not in DRAFTING:
        return None
    draft, kv_cache_dtype = request.draft, request.kv_cache_dtype
    draft_weights_gib, real = request.draft_weights_gib, None
    if draft is not None:
        model, source = draft.name, draft.source
        weights, error = draft.weights_gib, draft.weights_error_gib
        real = draft.kv_bytes_per_token(resolve_kv_dtype(draft.arch, kv_cache_dtype),
                                        layout.attn_tp)
    elif uses_builtin_mtp(arch, layout):
        model, source, weights, error = None, "the target's MTP layers", 0.0, 0.0
    elif draft_weights_gib:
        model, source, weights, error = None, "weights given", draft_weights_gib, 0.0
    else:
        model, source, weights, error = None, "unknown", None, None
    extra = max(0, real - cell.draft_bytes) * tokens / GIB if real is not None else 0.0
    graphs = _draft_graphs_gib(heuristic.decode_max_bs)
    outside = pre * (1 - mfs)
    need = _sglang_need_gib(heuristic)
    return DraftCharge(
        algorithm=algo, model=model, source=source, weights_gib=weights,
        weights_error_gib=error, kv_layers=draft_layers(arch, layout),
        kv_budget_bytes=cell.draft_bytes, kv_real_bytes=real, kv_extra_gib=extra,
        graphs_gib=graphs, outside_pool_gib=outside, sglang_need_gib=need,
        room_gib=_spare(outside, need) - graphs - extra)


def sglang_need_mb(reserve: MemoryDefaults) -> dict[str, float]:
    """What SGLang allocates outside the static pool at ``reserve``'s settings, MiB by
    cause: its reserve's terms (memory_hook.py) less the padding (RESERVE_PADDING), with
    the activations at the measured ACTIVATION_MIB_PER_TOKEN instead of its 1.5 MiB
    heuristic. The terms kept as SGLang computes them: attention-backend metadata (512),
    NCCL/cuBLAS workspaces of large parallel groups (tp x pp / 8 GiB), the decode and
    prefill CUDA graphs (reserve_for_graph_mb), deepep's buffers."""
    need = {k: v for k, v in reserve.reserve_breakdown.items() if k not in RESERVE_PADDING}
    if "activations" in need:
        tokens = need["activations"] / SGLANG_ACTIVATION_MIB_PER_TOKEN
        need["activations"] = tokens * ACTIVATION_MIB_PER_TOKEN
    return need


def _sglang_need_gib(reserve: MemoryDefaults) -> float:
    """sglang_need_mb in all, GiB."""
    return sum(sglang_need_mb(reserve).values()) / 1024


def _draft_graphs_gib(decode_max_bs: int) -> float:
    """The draft's CUDA graphs: DRAFT_GRAPH_SHARE x the target's 2 MiB per decode bs."""
    return DRAFT_GRAPH_SHARE * 2 * decode_max_bs / 1024


def _spare(outside: float, need: float) -> float:
    """What the memory outside the static pool holds beyond what SGLang's own graphs and
    activations take there (sglang_need_mb): the draft's graphs and pool overflow go
    there. A fraction that leaves less has no spare to give (the target's own shortfall
    is the max-safe warning's matter and is not charged to the draft twice)."""
    return max(0.0, outside - need)


def _draft_ceiling(d: DraftCharge | None, reserve: MemoryDefaults, pre: float,
                   after: float, cell: KvCell) -> float:
    """The highest mem_fraction_static that leaves a drafting launch's room at or above 0
    (1.0 without a draft): outside the static pool (pre x (1 - m)), SGLang's own need at
    ``reserve``'s settings, the draft's graphs at its decode graph size, and the draft pool
    beyond its budget, which grows with the tokens the fraction buys (k x the KV rest)."""
    if d is None:
        return 1.0
    need, graphs = _sglang_need_gib(reserve), _draft_graphs_gib(reserve.decode_max_bs)
    k = max(0, (d.kv_real_bytes or 0) - d.kv_budget_bytes) / cell.bytes_per_token
    # pre (1 - m) >= need + graphs + k (after - pre (1 - m)), solved for m
    return math.floor((1 - (need + graphs + k * after) / (pre * (1 + k))) * 1000) / 1000


def _limit_text(d: DraftCharge | None, draft_holds: bool) -> str:
    """What holds the fraction down: SGLang's own need, or with it a draft's needs."""
    if d is not None and draft_holds:
        return f"SGLang's graph/activation need with the {d.algorithm} draft's graphs and KV"
    return "SGLang's graph/activation need"


def _draft_lines(s: _Sizing) -> list[str]:
    """The draft's part of the budget, each figure with where it comes from."""
    d = s.draft
    if d is None:
        return []
    lines = []
    if d.model is not None and d.weights_gib is not None:
        how = "from its checkpoint" if d.source.startswith("checkpoint") else \
            f"estimated from its config, +/- {d.weights_error_gib or 0:.2f}"
        lines.append(f"draft {d.model} ({d.source}): weights {d.weights_gib:.2f} GiB/GPU "
                     f"({how}), in the weights above")
    kv = (f"draft KV: SGLang budgets {d.kv_layers} layer(s) of the target's cell, "
          f"{d.kv_budget_bytes} B/token, in the cell above")
    if d.kv_real_bytes is not None and d.kv_extra_gib > 0:
        kv += (f"; the draft's own pool takes {d.kv_real_bytes} B/token for the same "
               f"tokens: {d.kv_extra_gib:.2f} GiB beyond its budget, outside the static pool")
    lines.append(kv)
    lines.append(
        f"draft CUDA graphs ~{d.graphs_gib:.2f} GiB ({DRAFT_GRAPH_SHARE:g} x the decode "
        f"graphs' 2 MiB x bs {s.heuristic.decode_max_bs}); spare outside the static pool "
        f"max(0, {d.outside_pool_gib:.2f} GiB - SGLang's graphs and activations "
        f"{d.sglang_need_gib:.2f}) - draft graphs {d.graphs_gib:.2f} - draft KV beyond "
        f"its budget {d.kv_extra_gib:.2f} = room {d.room_gib:+.2f} GiB")
    return lines


def _draft_changes(arch: ModelArch, layout: Layout, s: _Sizing, verdict: FitVerdict) -> list[str]:
    """When the draft's graphs and pool overflow the memory outside the static pool: the
    decode graph size or the fraction that leaves them room (capture would OOM)."""
    d = s.draft
    if d is None or d.room_gib >= 0 or not verdict.starts:
        return []
    fixes = []
    bs_flag = decode_bs_flag(s.heuristic.version)
    # SGLang's default fraction follows the graph size: keep today's fraction explicitly,
    # or the smaller reserve only raises the fraction and the room stays as short
    keep = f" with --mem-fraction-static {s.mfs:.3f}" if s.defaults.mem_fraction_is_default \
        else ""
    for bs in (256, 128, 64, 32):
        if bs >= s.heuristic.decode_max_bs:
            continue
        _, lower = _launch_defaults(arch, layout, PlanRequest(
            s.gpu_memory_mib, version=s.heuristic.version,
            chunked_prefill_size=s.heuristic.chunked_prefill_size, cuda_graph_max_bs=bs))
        room = _spare(d.outside_pool_gib, _sglang_need_gib(lower)) \
            - _draft_graphs_gib(bs) - d.kv_extra_gib
        if room >= 0:
            fixes.append(f"{bs_flag} {bs}{keep} (room {room:+.2f} GiB)")
            break
    need = d.sglang_need_gib + d.graphs_gib + d.kv_extra_gib
    mfs = math.floor((1 - need / s.pre) * 1000) / 1000
    if 0 < mfs < s.mfs:
        fixes.append(f"--mem-fraction-static {mfs:.3f} (fewer KV tokens)")
    short = d.outside_pool_gib < d.sglang_need_gib
    return [
        f"the {d.algorithm} draft does not fit outside the static pool: room "
        f"{d.room_gib:+.2f} GiB (draft CUDA graphs {d.graphs_gib:.2f} GiB, draft KV beyond "
        f"its budget {d.kv_extra_gib:.2f} GiB"
        + ("; the fraction leaves nothing beyond SGLang's own graph/activation need"
           if short else "")
        + "): CUDA graph capture may run out of memory"
        + (f"; use {' or '.join(fixes)}" if fixes else "")
    ]


def _weight_parts(
    arch: ModelArch,
    layout: Layout,
    draft_weights_gib: float,
    given: list[WeightPart] | None = None,
) -> list[WeightPart]:
    """The model's weights per GPU (the given ones, e.g. the checkpoint's, else the
    record's) plus, when the user gives its size, a separate draft model: SGLang loads both
    before sizing the KV pool, so both come out of the budget."""
    parts = list(given) if given is not None else weights_per_gpu(arch, layout)
    if draft_weights_gib:
        parts.append(
            WeightPart("separate draft model (given)", draft_weights_gib * GIB, 1.0, "as given")
        )
    return parts


def _pre_load_free(
    gpu_memory_mib: float, init_overhead_gib: float, pre_load_free_gib: float | None
) -> float:
    """Free memory when weights start loading (SGLang's ``pre``): the measured figure when
    there is one, else memory.total less the init overhead (CUDA context, NCCL, cuBLAS;
    gpus.yaml). A measured figure above the card's memory.total is refused: it cannot be
    free, and it planned KV pools no card holds (200 GiB on an H200: 1.35M tokens)."""
    if pre_load_free_gib is not None:
        if pre_load_free_gib > gpu_memory_mib / 1024:
            raise InputError(
                "--pre-load-free-gib", "pre_load_free_gib",
                f"{pre_load_free_gib:g} GiB free before weights is more than the GPU holds "
                f"(memory.total {gpu_memory_mib:g} MiB = {gpu_memory_mib / 1024:.2f} GiB); "
                "give the 'Load weight begin. avail mem' figure of a startup log")
        return pre_load_free_gib
    return gpu_memory_mib / 1024 - init_overhead_gib


def _max_safe_mfs(pre: float, need_gib: float) -> float:
    """The ceiling every suggested mem_fraction_static is held to: the highest (to 3
    places, rounded down) whose memory outside the static pool still holds what SGLang
    allocates there (sglang_need_mb). 0.0 for a GPU without memory.

    Outside the pool is pre x (1 - m): the pool takes rest = after - pre x (1 - m)
    (kv_cache_configurator.py::_profile_available_bytes), so what stays free after it
    is pre x (1 - m) whatever the weights. SGLang's own default fraction keeps its whole
    reserve there, padding included, so it is always at or below this ceiling."""
    if pre <= 0:
        return 0.0
    return math.floor((1 - need_gib / pre) * 1000) / 1000


def decode_bs_flag(version: str) -> str:
    """The decode graph max bs flag of ``version``: --cuda-graph-max-bs up to 0.5.19 (the
    only spelling in 0.5.10.post1, a deprecated alias in 0.5.15-0.5.19), the per-phase
    --cuda-graph-max-bs-decode from 0.5.20, where the old one is ambiguous (sglang.md §0;
    gpuserve/data/dialects/sglang.yaml memory.cuda_graph_max_bs)."""
    return "--cuda-graph-max-bs" if version in _OLD_BS_FLAG else "--cuda-graph-max-bs-decode"


def _budget_lines(s: _Sizing, version: str) -> list[str]:
    """The budget arithmetic step by step, in the order SGLang computes it, so a reader can
    check every figure the verdict rests on."""
    gpu_memory_mib, defaults, mfs, pre, after = s.gpu_memory_mib, s.defaults, s.mfs, s.pre, s.after
    b = s.budget
    weights, a2a_buffer_gib, cell, kv_dtype = s.weights, s.a2a_buffer_gib, s.cell, s.kv_dtype
    return [
        f"GPU memory.total {gpu_memory_mib:.0f} MiB ({gpu_memory_mib / 1024:.2f} GiB); free before "
        f"weights ~{pre:.2f} GiB",
        f"mem_fraction_static {mfs:.3f} "
        + (
            f"(SGLang {version} default: (G - R)/G with R = {defaults.reserved_mb:.0f} MiB = "
            + " + ".join(f"{k} {v:.0f}" for k, v in defaults.reserve_breakdown.items())
            + ")"
            if defaults.mem_fraction_is_default
            else "(set explicitly)"
        ),
        f"weights {weights:.2f} GiB/GPU"
        + (f" + a2a buffers {a2a_buffer_gib:.2f} GiB" if a2a_buffer_gib else "")
        + f" -> free after weights {after:.2f} GiB",
        f"rest = {after:.2f} - {pre:.2f} x (1 - {mfs:.3f}) = {b.rest_gib:.2f} GiB for the KV cache",
        f"KV {cell.bytes_per_token} B/token ({cell.formula}, {kv_dtype})",
    ]


def _record_notes(arch: ModelArch, layout: Layout, draft_weights_gib: float | bool
                  ) -> list[str]:
    """Caveats about the inputs rather than the budget: how the record compares with the
    checkpoint's own size, and draft weights the prediction cannot know."""
    notes: list[str] = []
    if arch.checkpoint_bytes:
        # model.safetensors.index.json total_size vs the record's own parameter bytes (MTP
        # layers included, as checkpoints ship them): a cross-check of the record.
        whole = weights_per_gpu(arch, Layout(speculative="NEXTN" if arch.mtp_layers else None))
        total = sum(p.gib for p in whole)
        ckpt = arch.checkpoint_bytes / GIB
        notes.append(
            f"checkpoint total_size {ckpt:.1f} GiB vs {total:.1f} GiB from the config "
            f"({(total - ckpt) / ckpt:+.0%})"
        )
    if layout.speculative and not uses_builtin_mtp(arch, layout) and not draft_weights_gib:
        notes.append(
            f"{layout.speculative} draft model weights are not included (unknown): name its "
            "record (speculative.draft_arch, --draft-arch) or checkpoint (--draft-dir), or "
            "pass --draft-weights-gib; SGLang charges them to the same KV budget"
        )
    return notes


def _verdict(problems: list[str], s: _Sizing) -> tuple[FitVerdict, list[str]]:
    """The verdict and the line that explains it, checked in SGLang's order: a layout it
    refuses, then _profile_available_bytes (rest <= 0), then the pool sizing (no token)."""
    if problems:
        return FitVerdict.INVALID, []
    mfs, pre, after, b = s.mfs, s.pre, s.after, s.budget
    if b.refused:
        return FitVerdict.REFUSED, [
            f"SGLang raises: Loaded weights leave no GPU memory for the KV cache under "
            f"--mem-fraction-static={mfs}; "
            + (f"minimum viable {b.suggested_mfs:.3f} (1 {signed_term(after)}/{pre:.2f}, "
               "rounded up)" if b.min_viable_mfs < 1 else
               f"no mem_fraction_static fits: the weights leave {after:.2f} GiB of {pre:.2f}")
        ]
    if s.tokens <= 0:
        return FitVerdict.NO_KV, [
            "SGLang raises: Not enough memory. Please try to increase --mem-fraction-static."
        ]
    ctx, tokens = s.ctx, s.tokens
    verdict = FitVerdict.FITS if (ctx is None or tokens >= ctx) else FitVerdict.TIGHT
    return verdict, [
        f"KV tokens {tokens:,} ({tokens * s.cell.bytes_per_token / GIB:.2f} GiB)"
        + (f"; context {ctx:,}" if ctx else "")
    ]


def _changes_for_verdict(arch: ModelArch, layout: Layout, s: _Sizing,
                         verdict: FitVerdict) -> list[str]:
    """Fixes when the launch fails or falls short of the context; when it fits, a warning
    if the fraction leaves less than SGLang allocates outside the static pool."""
    if verdict in (FitVerdict.REFUSED, FitVerdict.NO_KV, FitVerdict.TIGHT):
        return suggest_changes(arch, layout, s)
    outside = s.pre * (1 - s.mfs)
    if outside < s.graph_reserve and verdict == FitVerdict.FITS:
        return [_short_outside_line(s, outside)]
    return []


def _short_outside_line(s: _Sizing, outside: float) -> str:
    """The warning of a fraction that leaves less outside the static pool than SGLang
    allocates there (sglang_need_mb), each cause with its figure."""
    need = sglang_need_mb(s.heuristic)
    terms = ", ".join(f"{_NEED_LABELS.get(k, k)} {v / 1024:.2f}" for k, v in need.items() if v)
    h = s.heuristic
    return (
        f"mem_fraction_static {s.mfs:.3f} leaves {outside:.2f} GiB free after the KV pool "
        f"({s.pre:.2f} x (1 - {s.mfs:.3f})), less than SGLang allocates there at decode "
        f"graph max bs {h.decode_max_bs} and {h.chunked_prefill_size}-token chunks "
        f"({s.graph_reserve:.2f} GiB: {terms}): CUDA graph capture may OOM; keep mfs <= "
        f"{s.max_safe:.3f} or lower {decode_bs_flag(h.version)} / --chunked-prefill-size"
    )


def _plan(arch: ModelArch, layout: Layout, s: _Sizing, request: PlanRequest, *,
          verdict: str, explanation: list[str], changes: list[str], problems: list[str]
          ) -> Plan:
    """Assemble the Plan: the sizing's figures in the shape the CLI and JSON output use."""
    tokens, ctx = s.tokens, s.ctx
    requested_max_running = request.max_running_requests
    return Plan(
        model=arch.name,
        gpu=request.gpu_name,
        gpus=request.gpu_count,
        version=request.version,
        layout=asdict(layout),
        defaults=s.defaults.to_dict(),
        mem_fraction_static=s.mfs,
        kv_dtype=s.kv_dtype,
        weights=[
            {
                "part": p.name,
                "gib": round(p.gib, 3),
                "how": p.how,
                "bytes_per_param": round(p.bytes_per_param, 4),
            }
            for p in s.parts
        ],
        weights_gib=s.weights,
        a2a_buffer_gib=s.a2a_buffer_gib,
        pre_load_free_gib=s.pre,
        avail_after_weights_gib=s.after,
        kv_cell=asdict(s.cell),
        rest_gib=s.budget.rest_gib,
        kv_tokens=tokens,
        kv_gib=tokens * s.cell.bytes_per_token / GIB,
        context_length=ctx,
        max_running_requests=(
            resolve_max_running_requests(tokens, ctx, requested_max_running, layout.attn_dp)
            if tokens > 0 and ctx
            else None
        ),
        graph_reserve_gib=s.graph_reserve,
        verdict=verdict,
        min_viable_mfs=s.budget.min_viable_mfs,
        max_safe_mfs=s.max_safe,
        explanation=explanation,
        changes=changes,
        problems=problems,
    )


def suggest_changes(arch: ModelArch, layout: Layout, s: _Sizing) -> list[str]:
    """Concrete changes, most direct first, each with the number that makes it work. A
    drafting launch's fraction is held low enough to leave its draft room too (the
    sizing's reserve is SGLang's own heuristic, ``s.heuristic``)."""
    pre, after, cell, max_safe, defaults, draft = (s.pre, s.after, s.cell, s.max_safe,
                                                   s.heuristic, s.draft)
    a2a_buffer_gib = s.a2a_buffer_gib
    want_tokens = s.ctx or 4096
    target = mfs_for_tokens(pre, after, want_tokens, cell.bytes_per_token)
    min_viable = math.ceil((1 - after / pre) * 1000) / 1000
    ceiling = _draft_ceiling(draft, defaults, pre, after, cell)
    limit = _limit_text(draft, ceiling < max_safe)
    max_safe = min(max_safe, ceiling)
    if min_viable >= 1:
        return [cannot_fit_change(after, pre)] + [
            c for c in (_redundant_experts_change(arch, layout),
                        _plain_tp_change(arch, layout, a2a_buffer_gib),
                        _attn_dp_change(layout, defaults), _speculative_change(arch, layout))
            if c]
    if target <= max_safe:
        out = [
            f"raise --mem-fraction-static to {target:.3f} ({want_tokens:,} KV tokens need "
            f"{target:.3f}; {limit} allows up to {max_safe:.3f})"
        ]
    else:
        out = _best_fraction_changes(arch, layout, s, want_tokens=want_tokens,
                                     min_viable=min_viable, max_safe=max_safe, limit=limit)
    if not out:
        out.append(
            f"no mem_fraction_static leaves room for both the KV cache and {limit} "
            f"(minimum viable {min_viable:.3f} > {max_safe:.3f}): "
            f"weights must shrink (more GPUs or a smaller quantization) or SGLang's need must"
        )
    optional = (
        _fp8_kv_change(arch, layout, cell, s.kv_dtype, s.sm_major, s.dsa_backend),
        _redundant_experts_change(arch, layout),
        _plain_tp_change(arch, layout, a2a_buffer_gib),
        _attn_dp_change(layout, defaults),
        _speculative_change(arch, layout),
    )
    return out + [change for change in optional if change]


def cannot_fit_change(after: float, pre: float) -> str:
    """The change for a launch no fraction can serve (weights leave nothing, or less
    than nothing, of the free memory): what would, never a fraction above 1."""
    return (f"no mem_fraction_static fits (weights leave {after:.2f} GiB of {pre:.2f} free "
            "per GPU): spread the weights over more GPUs (a larger --tp), serve a smaller "
            "quantization, or drop what adds to them (EP's replicated shared experts, a draft)")


def _kv_tokens_at(pre: float, after: float, mfs: float, cell: KvCell) -> int:
    """KV tokens SGLang would size at ``mfs``: rest = after - pre x (1 - mfs), never
    negative, so an option can be quoted in tokens as well as in GiB."""
    return max(0, int((after - pre * (1 - mfs)) * GIB) // cell.bytes_per_token)


def _best_fraction_changes(arch: ModelArch, layout: Layout, s: _Sizing, *, want_tokens: int,
                           min_viable: float, max_safe: float,
                           limit: str = "SGLang's graph/activation need") -> list[str]:
    """When the wanted tokens need more than the reserve allows: the most the fraction can
    rise as things stand, then each knob that shrinks SGLang's own need (and a draft's
    graphs) and so lets it rise further, stopping at the first that reaches the wanted
    tokens."""
    out: list[str] = []
    best, draft = max_safe, s.draft
    tokens_at_best = _kv_tokens_at(s.pre, s.after, best, s.cell)
    if best > min_viable:
        out.append(
            f"raise --mem-fraction-static to {best:.3f} (the most {limit} "
            f"allows): about {tokens_at_best:,} KV tokens"
        )
    for label, bs, cps in _reserve_knobs(s.heuristic):
        safe, toks = _with_smaller_reserve(arch, layout, s, bs=bs, cps=cps)
        if toks > 0 and safe > best + 0.0005:
            best = safe
            out.append(
                f"use {label} with --mem-fraction-static {safe:.3f} (SGLang's own need "
                f"shrinks that far{', the draft still fitting' if draft else ''}): about "
                f"{toks:,} KV tokens"
            )
            if toks >= want_tokens:
                break
    return out


def _reserve_knobs(defaults: MemoryDefaults) -> list[tuple[str, int, int]]:
    """(flag text, decode graph max bs, chunked-prefill size) to try, smallest change first:
    only values below the current ones, and both together when there is more than one."""
    bs_flag = decode_bs_flag(defaults.version)
    bs0, cps0 = defaults.decode_max_bs, defaults.chunked_prefill_size
    knobs = [(f"{bs_flag} {bs}", bs, cps0) for bs in (256, 128, 64) if bs < bs0]
    knobs += [(f"--chunked-prefill-size {c}", bs0, c) for c in (4096, 2048) if 0 < c < cps0]
    if len(knobs) > 1:
        knobs.append(
            (
                f"{bs_flag} 128 and --chunked-prefill-size 2048",
                min(bs0, 128),
                min(cps0, 2048) if cps0 > 0 else cps0,
            )
        )
    return knobs


def _with_smaller_reserve(arch: ModelArch, layout: Layout, s: _Sizing, *, bs: int, cps: int
                          ) -> tuple[float, int]:
    """(safe mem_fraction_static, KV tokens) once SGLang's reserve is recomputed for a
    smaller decode graph batch and chunked-prefill size: what that knob buys (a draft's
    smaller graphs included)."""
    # Shrink SGLang's own reserve: decode graphs (2 MiB per bs, more with attention-DP)
    # and activations (1.5 MiB per chunked-prefill token); report what each knob buys.
    pre, after, cell = s.pre, s.after, s.cell
    lower = memory_defaults(
        s.gpu_memory_mib,
        MemorySettings(tp=layout.tp,
        pp=layout.pp,
        attn_dp=layout.attn_dp,
        use_mla=arch.is_mla,
        version=s.heuristic.version,
        decode_max_bs=bs,
        chunked_prefill_size=cps,
        moe_a2a_backend=layout.moe_a2a_backend),
    )
    safe = min(_max_safe_mfs(pre, _sglang_need_gib(lower)),
               _draft_ceiling(s.draft, lower, pre, after, cell))
    return safe, _kv_tokens_at(pre, after, safe, cell)


def _fp8_kv_change(
    arch: ModelArch,
    layout: Layout,
    cell: KvCell,
    kv_dtype: str,
    sm_major: int | None,
    dsa_backend: str | None,
) -> str | None:
    """An fp8 KV cache, quoted as the gain in tokens: it helps whatever the budget is, so it
    is offered even when a fraction change alone would do."""
    if kv_dtype.startswith("fp8"):
        return None
    fp8 = kv_cell(
        arch,
        kv_dtype="fp8_e4m3",
        attn_tp=layout.attn_tp,
        draft=draft_layers(arch, layout),
        sm_major=sm_major,
        dsa_backend=dsa_backend,
    )
    return (
        f"use --kv-cache-dtype fp8_e4m3: {fp8.bytes_per_token} B/token instead of "
        f"{cell.bytes_per_token}, x{cell.bytes_per_token / fp8.bytes_per_token:.2f} the "
        f"tokens of any positive KV budget"
    )


def _redundant_experts_change(arch: ModelArch, layout: Layout) -> str | None:
    """Redundant experts add num_redundant / ep whole experts to every EP rank: dropping them
    returns that weight memory to the KV budget."""
    if not (layout.num_redundant_experts and arch.is_moe):
        return None
    per_expert = 3 * arch.hidden_size * arch.moe_intermediate_size * len(arch.moe_layer_ids)
    bpp = _bytes_per_param(arch, "routed_experts", component_modules(arch)["routed_experts"])
    saved = layout.num_redundant_experts / layout.ep * per_expert * bpp / layout.moe_tp / GIB
    return (
        f"drop --ep-num-redundant-experts {layout.num_redundant_experts}: saves {saved:.2f} GiB/GPU"
    )


def _plain_tp_change(arch: ModelArch, layout: Layout, a2a_buffer_gib: float) -> str | None:
    """All-to-all backends replicate the shared experts and add dispatch buffers; plain TP
    shards the former and needs neither. Offered only when it frees a noticeable amount."""
    if not (layout.moe_a2a_backend in A2A_REPLICATE_SHARED and arch.is_moe):
        return None
    tp_layout = Layout(
        tp=layout.tp,
        attn_dp=layout.attn_dp,
        pp=layout.pp,
        speculative=layout.speculative,
        draft_layers=layout.draft_layers,
    )
    saved = (
        sum(p.gib for p in weights_per_gpu(arch, layout))
        + a2a_buffer_gib
        - sum(p.gib for p in weights_per_gpu(arch, tp_layout))
    )
    if saved > 0.05:
        return (
            f"serve with plain TP (no --moe-a2a-backend {layout.moe_a2a_backend}): "
            f"shared experts sharded again and no dispatch buffers, {saved:.2f} GiB/GPU "
            f"more free"
        )
    return None


def _attn_dp_change(layout: Layout, defaults: MemoryDefaults) -> str | None:
    """Attention DP pads the decode graphs per worker and replicates attention weights;
    dropping it gives both back."""
    if layout.attn_dp > 1:
        return (
            f"drop attention-DP {layout.attn_dp}: its graph reserve "
            f"({defaults.reserve_breakdown.get('cuda_graphs', 0) / 1024:.1f} GiB of padding) "
            f"and replicated attention weights return"
        )
    return None


def _speculative_change(arch: ModelArch, layout: Layout) -> str | None:
    """Speculative decoding charges its draft weights and draft KV to the target's budget;
    turning it off returns both."""
    if draft_layers(arch, layout):
        return (
            "disable speculative decoding: draft weights and draft KV are charged to the "
            "same budget"
        )
    return None
