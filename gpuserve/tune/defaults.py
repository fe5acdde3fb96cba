"""``auto`` knob values from the model and the host.

- ``layout``: tensor parallel over every GPU the incumbent uses; expert parallel sizes
  that divide both tp and the number of routed experts (1 and tp, and tp/2 when it
  divides); attention data parallel over tp when the heads divide by it (SGLang's
  attention-DP splits attention by ``tp / attn_dp``: tp_dp_dp_attention_explainer.md).
- ``memory.cuda_graph_max_bs``: SGLang's own default for this GPU and version
  (memory_defaults, the same code the planner uses), half of it and double it, and the
  incumbent's value.
- ``memory.mem_fraction_static``: SGLang's automatic choice, and the incumbent's value
  and 0.05 either side.
- ``speculative``: off, and the incumbent's algorithm when it has one.

Other knobs have no defaults: ``auto`` for them is an error naming the knob.
"""

from __future__ import annotations

from typing import Any

from gpuserve.memory.memory_defaults import MemorySettings, memory_defaults
from gpuserve.tune.space import OFF, TuneSpec

AUTO_KNOBS = ("layout", "memory.cuda_graph_max_bs", "memory.mem_fraction_static", "speculative")


def auto_values(name: str, spec: TuneSpec, incumbent, arch, gpus: list[dict],
                version: str) -> list[Any]:
    if name == "layout":
        return _layouts(incumbent, arch, len(gpus))
    if name == "memory.cuda_graph_max_bs":
        return _graph_sizes(incumbent, arch, gpus, version)
    if name == "memory.mem_fraction_static":
        current = incumbent.memory.mem_fraction_static
        out: list[Any] = ["auto"]
        if current is not None:
            out += sorted({round(current + d, 2) for d in (-0.05, 0.0, 0.05)
                           if 0.5 <= current + d <= 0.95})
        return out
    if name == "speculative":
        spec_ = incumbent.speculative
        if not spec_.algorithm:
            raise spec.error(f"knobs.{name}", "auto needs a speculative algorithm in the "
                             "incumbent (its draft model is not known otherwise)")
        return [OFF, {f"speculative.{k}": getattr(spec_, k) for k in
                      ("algorithm", "draft_model", "draft_arch", "num_steps",
                       "eagle_topk", "num_draft_tokens") if getattr(spec_, k) is not None}]
    raise spec.error(f"knobs.{name}", f"no automatic values for this knob (auto works for "
                     f"{', '.join(AUTO_KNOBS)}): list the values")


def _layouts(incumbent, arch, gpu_count: int) -> list[dict[str, Any]]:
    tp = incumbent.parallel.tp if incumbent.parallel.tp > 1 else gpu_count
    experts = getattr(arch, "n_routed_experts", 0) if arch else 0
    heads = getattr(arch, "num_attention_heads", 0) if arch else 0
    out: list[dict[str, Any]] = [{"parallel.tp": tp, "parallel.ep": 1,
                                  "parallel.attention_dp": 1}]
    if experts:
        for ep in sorted({tp // 2, tp}):
            if ep > 1 and tp % ep == 0 and experts % ep == 0:
                out.append({"parallel.tp": tp, "parallel.ep": ep, "parallel.attention_dp": 1})
    if heads and tp > 1 and heads % tp == 0:
        out.append({"parallel.tp": tp, "parallel.ep": 1, "parallel.attention_dp": tp})
    return out


def _graph_sizes(incumbent, arch, gpus: list[dict], version: str) -> list[int]:
    mib = min((float(g.get("memory_total_mib") or 0) for g in gpus), default=0) or None
    d = memory_defaults(mib, MemorySettings(tp=incumbent.parallel.tp,
                        attn_dp=incumbent.parallel.attention_dp,
                        use_mla=bool(arch and arch.attention in ("mla", "dsa")),
                        version=version)).decode_max_bs
    sizes = {max(8, d // 2), d, min(1024, d * 2)}
    if incumbent.memory.cuda_graph_max_bs:
        sizes.add(incumbent.memory.cuda_graph_max_bs)
    return sorted(sizes)
