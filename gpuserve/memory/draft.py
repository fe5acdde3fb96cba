"""A separate speculative draft model as the memory planner charges it on one GPU.

Why: SGLang loads a draft model (EAGLE/EAGLE3 heads, a STANDALONE small model) beside the
target and charges all of it to the same GPU, and a plan without it says "fits" for
launches that die in CUDA-graph capture. What SGLang does (0.5.23, cited in
docs/planner.md, "Speculative drafts"):

* weights: the draft worker's weights load before the KV pool is sized and are counted
  with the target's (managers/scheduler.py, preloaded weights of target + draft; the
  "draft weights are now counted" refusal of kv_cache_configurator.py). EAGLE heads share
  the target's embedding, and its LM head when they have none of their own
  (speculative/eagle_worker.py, set_embed / set_embed_and_head; models/llama_eagle3.py);
* KV: the draft's pool holds as many tokens as the target's (the draft worker reuses the
  target's MemoryPoolConfig), budgeted as ``eagle_draft_num_layers`` layers of the
  *target's* per-layer cell (model_executor/pool_configurator.py,
  DefaultPoolConfigurator.__init__; the layer count from the draft's config in
  model_runner.py: num_nextn_predict_layers, else num_hidden_layers);
* CUDA graphs: the draft's decode and draft-extend graphs are captured after the pool,
  outside the static fraction (speculative/eagle_draft_cuda_graph_runner.py,
  eagle_draft_extend_cuda_graph_runner.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuserve import safeload
from gpuserve.errors import InputError
from gpuserve.memory.checkpoint import CheckpointScan, checkpoint_weights, classify_layer_tensor
from gpuserve.memory.models import ModelArch, arch_from_config
from gpuserve.memory.planner import (
    Layout,
    UnsupportedKvDtype,
    WeightPart,
    kv_cell,
    shard,
    weights_per_gpu,
)
from gpuserve.paths import DRAFT_MODELS_DIR, draft_record_names

#: Algorithms that load a separate draft model (NEXTN/MTP draft with the checkpoint's own
#: layers, NGRAM with none).
SEPARATE_DRAFT = ("EAGLE", "EAGLE3", "STANDALONE")
#: Draft heads: they share the target's embedding (and its LM head unless they have one).
HEADS = ("EAGLE", "EAGLE3")
#: How far a draft's weights from its config (no checkpoint scan) may be off, as a share.
RECORD_WEIGHTS_ERROR = 0.10


@dataclass(frozen=True)
class Draft:
    """A separate draft model on one GPU: its weights, the KV layers SGLang budgets for it
    and its own architecture (the geometry of the pool it really allocates)."""

    name: str
    algorithm: str
    source: str  # "checkpoint <dir>" or "record <name>"
    weights: tuple[WeightPart, ...]
    kv_layers: int
    arch: ModelArch

    @property
    def exact(self) -> bool:
        """Weights from the checkpoint's own tensors (else estimated from its config)."""
        return self.source.startswith("checkpoint")

    @property
    def weights_gib(self) -> float:
        return sum(p.gib for p in self.weights)

    @property
    def weights_error_gib(self) -> float:
        """What the weights may still be off by: nothing when scanned."""
        return 0.0 if self.exact else RECORD_WEIGHTS_ERROR * self.weights_gib

    def kv_bytes_per_token(self, kv_dtype: str, attn_tp: int) -> int:
        """Bytes per token of the pool the draft worker allocates on one GPU, with the
        draft's own heads and head dims (its dtype when the target's KV dtype does not
        apply to it, e.g. an MLA-only fp4)."""
        try:
            cell = kv_cell(self.arch, kv_dtype=kv_dtype, attn_tp=attn_tp)
        except UnsupportedKvDtype:
            cell = kv_cell(self.arch, kv_dtype=self.arch.dtype, attn_tp=attn_tp)
        return cell.target_bytes * self.kv_layers // max(1, self.arch.num_layers)


def draft_kv_layers(cfg: dict, arch: ModelArch) -> int:
    """SGLang's eagle_draft_num_layers: num_nextn_predict_layers when the config has it,
    else its decoder layers."""
    nextn = cfg.get("num_nextn_predict_layers")
    return int(nextn) if isinstance(nextn, int) and nextn > 0 else arch.num_layers


def draft_from_config(cfg: dict, *, name: str, source: str, algorithm: str,
                      layout: Layout, file: str) -> Draft:
    """A draft whose weights are estimated from its config.json keys."""
    arch = arch_from_config(cfg, name=name, file=file)
    algo = algorithm.upper()
    own = _draft_layout(layout)
    if algo not in HEADS:
        parts = [_named(p) for p in weights_per_gpu(arch, own)]
    else:
        parts = _head_parts(arch, cfg, algo, own)
    return Draft(name, algo, source, tuple(parts), draft_kv_layers(cfg, arch), arch)


def draft_from_scan(scan: CheckpointScan, *, algorithm: str, layout: Layout) -> Draft:
    """A draft whose weights are its checkpoint's own tensors, shared as SGLang shards them
    (the head's embedding and a borrowed LM head left out)."""
    arch = scan.arch()
    algo = algorithm.upper()
    own = _draft_layout(layout)
    if algo not in HEADS:
        parts = [_named(p) for p in checkpoint_weights(scan, own, arch)]
    else:
        parts = _scanned_head_parts(scan, arch, own_head=_own_lm_head(scan.config, algo),
                                    layout=own)
    return Draft(arch.name, algo, f"checkpoint {scan.directory}", tuple(parts),
                 draft_kv_layers(scan.config, arch), arch)


def load_draft_record(name: str, *, algorithm: str, layout: Layout) -> Draft:
    """A shipped draft record, ``gpuserve/data/models/drafts/<name>.yaml``."""
    path = DRAFT_MODELS_DIR / f"{name}.yaml"
    if not path.is_file():
        raise InputError("speculative.draft_arch", "draft_arch",
                         f"no draft record {name!r}; known: {', '.join(draft_record_names())}")
    data = safeload.load_yaml_file(path)
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
        raise InputError(path, "config", "a draft record needs a config: mapping")
    if not data.get("sources"):
        raise InputError(path, "sources", "a draft record needs its sources")
    return draft_from_config(data["config"], name=name, source=f"record {name}",
                             algorithm=algorithm, layout=layout, file=str(path))


def resolve_draft(algorithm: str | None, *, layout: Layout, draft_arch: str | None = None,
                  scan: CheckpointScan | None = None) -> Draft | None:
    """The separate draft a launch loads, as well as it is known: its checkpoint's scan,
    else its record; None without a separate draft (NEXTN/MTP layers of the target,
    NGRAM) or when nothing describes it (the plan then says its weights are unknown)."""
    algo = (algorithm or "").upper()
    if algo not in SEPARATE_DRAFT:
        return None
    if scan is not None:
        return draft_from_scan(scan, algorithm=algo, layout=layout)
    if draft_arch:
        return load_draft_record(draft_arch, algorithm=algo, layout=layout)
    return None


def local_draft_dir(path: str | None, model_path: str) -> str | None:
    """A separate draft's checkpoint directory the host can read like the model's: an
    absolute ``speculative.draft_model`` other than the model's own directory (whose MTP
    layers are in its own scan); None for a Hub id, nothing, or the model itself."""
    if not path or not path.startswith("/") or path.rstrip("/") == model_path.rstrip("/"):
        return None
    return path


def _draft_layout(layout: Layout) -> Layout:
    """The draft runs on the target's TP group (eagle_worker.py, draft_tp_context), dense."""
    return Layout(tp=layout.tp, attn_dp=layout.attn_dp, pp=layout.pp)


def _named(part: WeightPart) -> WeightPart:
    return WeightPart(f"draft {part.name}", part.params_per_gpu, part.bytes_per_param, part.how)


def _own_lm_head(cfg: dict, algo: str) -> bool:
    """EAGLE3 heads keep an LM head of draft_vocab_size rows; without draft_vocab_size, or
    tied, SGLang loads the target's (llama_eagle3.py, load_lm_head_from_target). EAGLE
    heads take the target's embedding and head (eagle_worker.py, set_embed_and_head)."""
    return algo == "EAGLE3" and not cfg.get("tie_word_embeddings") and \
        isinstance(cfg.get("draft_vocab_size"), int)


def _head_parts(arch: ModelArch, cfg: dict, algo: str, layout: Layout) -> list[WeightPart]:
    """An EAGLE/EAGLE3 head from its config: its decoder layers (the first one's QKV reads
    [embedding, hidden], 2h wide, in EAGLE3), fc (3 x target hidden -> h for EAGLE3's
    auxiliary states, 2h -> h for EAGLE; a plain replicated nn.Linear) and its own LM head
    of draft_vocab_size rows when it has one."""
    h, bpp = arch.hidden_size, float(arch.dtype_bytes)
    parts = [_named(p) for p in weights_per_gpu(arch, layout)
             if p.name not in ("embedding", "lm_head")]
    if _own_lm_head(cfg, algo):
        share, how = shard("lm_head", layout, arch)
        parts.append(WeightPart("draft lm_head", cfg["draft_vocab_size"] * h * share, bpp, how))
    if algo == "EAGLE3":
        q_share, how = shard("attention", layout, arch)
        kv_share, _ = shard("attention_kv", layout, arch)
        extra = h * (arch.num_attention_heads * arch.head_dim * q_share
                     + 2 * arch.num_kv_heads * arch.head_dim * kv_share)
        parts.append(WeightPart("draft wide QKV (2h in)", extra, bpp, how))
    target_h = cfg.get("target_hidden_size") if isinstance(cfg.get("target_hidden_size"),
                                                            int) else h
    fc_in = 3 * target_h if algo == "EAGLE3" else 2 * h
    parts.append(WeightPart("draft fc", fc_in * h, bpp, "replicated"))
    return parts


def _head_kind(name: str, own_head: bool) -> str | None:
    """The planner's shard kind of one tensor of an EAGLE head checkpoint (None: not
    resident: the shared embedding, a borrowed LM head, the d2t/t2d vocabulary maps)."""
    bare = name.removeprefix("model.")
    if bare.startswith("embed_tokens.") or bare in ("d2t", "t2d"):
        return None
    if bare.startswith("lm_head."):
        return "lm_head" if own_head else None
    if bare.startswith("norm."):
        return "norm"
    for prefix in ("midlayer.", "layers.", "midlayers."):
        if bare.startswith(prefix):
            rest = bare[len(prefix):]
            if prefix != "midlayer.":
                rest = rest.split(".", 1)[1] if "." in rest else rest
            return classify_layer_tensor(rest, False)
    return "other"  # fc and anything else: replicated


def _scanned_head_parts(scan: CheckpointScan, arch: ModelArch, *, own_head: bool,
                        layout: Layout) -> list[WeightPart]:
    totals: dict[str, list[float]] = {}
    hows: dict[str, str] = {}
    for t in scan.tensors:
        kind = _head_kind(t.pattern, own_head)
        if kind is None:
            continue
        share, how = shard(kind, layout, arch)
        label = "draft fc and other" if kind == "other" else f"draft {kind.replace('_', ' ')}"
        acc = totals.setdefault(label, [0.0, 0.0])
        acc[0] += (t.params or t.nbytes) * share
        acc[1] += t.nbytes * share
        hows[label] = how
    return [WeightPart(label, params, nbytes / params, hows[label])
            for label, (params, nbytes) in totals.items() if nbytes]
