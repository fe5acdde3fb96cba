"""Check the planner against measured SGLang start-ups (memory_cases.jsonl).

For each case it compares, wherever the case states them:
  * weights per GPU (``weights_mem_usage_gb``) with the model record + tp/ep/quantization;
  * KV bytes per token (logged K+V or KV size / #tokens) with ``_compute_cell_size``;
  * KV tokens, predicted from the case's own free-memory figures and mem fraction
    (``_profile_available_bytes``); a missing free-before figure is derived as
    ``avail after + mem usage`` (how model_runner.py computes mem usage) and a missing
    fraction as SGLang's default when the inputs file allows it.
Cases without a model record, or without figures to compare, are reported as skipped with
the reason. Used by tests/unit/memory/test_planner.py and bench/planner_accuracy.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gpuserve.host.gpus import get_gpu
from gpuserve.memory.memory_defaults import MemorySettings, memory_defaults
from gpuserve.memory.models import resolve_model
from gpuserve.memory.planner import GIB, Layout, budget, kv_cell, resolve_kv_dtype, weights_per_gpu

KV_DTYPES_FROM_LOG = {"torch.bfloat16": "bf16", "torch.float8_e4m3fn": "fp8_e4m3"}


@dataclass
class CaseResult:
    case_id: int
    model: str
    source: str
    status: str  # "checked" or "skipped"
    reason: str = ""
    rows: list[dict] = field(default_factory=list)  # {"what", "predicted", "measured", "error"}

    def errors(self, what: str) -> list[float]:
        return [r["error"] for r in self.rows if r["what"] == what and not r.get("excluded")]


def _err(pred: float, meas: float) -> float:
    return (pred - meas) / meas


def load_cases(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def evaluate(cases_path: str | Path, inputs_path: str | Path, repo_root: Path) -> list[CaseResult]:
    inputs = yaml.safe_load(Path(inputs_path).read_text())["cases"]
    results = []
    for case in load_cases(cases_path):
        cid = case["id"]
        spec = inputs.get(cid)
        res = CaseResult(cid, str(case.get("model")), case["source_url"], "skipped")
        results.append(res)
        if spec is None or "skip" in spec:
            res.reason = spec["skip"] if spec else "not listed in the planner inputs file"
            continue
        _evaluate_case(res, case, spec, repo_root)
    return results


def _evaluate_case(res: CaseResult, case: dict, spec: dict, repo_root: Path) -> None:
    """The planner's predictions for one case beside the figures it states, as rows of
    ``res`` (weights, free memory after them, KV bytes per token, KV tokens)."""
    model = spec["model"]
    candidate = repo_root / model
    arch = resolve_model(candidate if candidate.is_dir() else model)
    layout = Layout(tp=spec.get("tp", 1), ep=spec.get("ep", 1), attn_dp=spec.get("attn_dp", 1))
    gpu = get_gpu(spec["gpu"]) if spec.get("gpu") else None
    res.model = arch.name
    # -- weights
    weights = sum(p.gib for p in weights_per_gpu(arch, layout))
    res.rows += _weight_rows(case, spec, weights, gpu)
    # -- KV bytes per token
    tokens = case.get("kv_tokens") or case.get("max_total_num_tokens")
    kv_size = None
    if case.get("k_size_gb") is not None:
        kv_size = case["k_size_gb"] + (case.get("v_size_gb") or 0.0)
    elif case.get("kv_size_gb") is not None:
        kv_size = case["kv_size_gb"]
    kv_dtype = spec.get("kv_cache_dtype") or resolve_kv_dtype(arch, "auto")
    cell = kv_cell(
        arch,
        kv_dtype=kv_dtype,
        attn_tp=layout.attn_tp,
        sm_major=gpu.sm_major if gpu else None,
        dsa_backend=spec.get("dsa_backend"),
    )
    if tokens and kv_size:
        measured = kv_size * GIB / tokens
        res.rows.append(
            {
                "what": "KV B/token",
                "predicted": cell.bytes_per_token,
                "measured": measured,
                "error": _err(cell.bytes_per_token, measured),
            }
        )
    res.rows += _kv_token_rows(case, spec, arch, layout, gpu, weights, tokens,
                               cell.bytes_per_token)
    if res.rows:
        res.status = "checked"
    else:
        res.reason = "case states no weights, KV size or free-memory figures to compare"


def _weight_rows(case: dict, spec: dict, weights: float, gpu) -> list[dict]:
    """Predicted weights per GPU against the case's, and the free memory after them
    when only that is stated (pre from the GPU spec)."""
    rows = []
    if case.get("weights_mem_usage_gb") is not None:
        row = {
            "what": "weights GiB/GPU",
            "predicted": weights,
            "measured": case["weights_mem_usage_gb"],
            "error": _err(weights, case["weights_mem_usage_gb"]),
        }
        if spec.get("weights_outlier"):
            row.update(excluded=True, note=spec["weights_outlier"])
        rows.append(row)
    # -- free memory after weights, when only that is stated (pre from the GPU spec)
    if (
        case.get("avail_mem_after_weights_gb") is not None
        and case.get("weights_mem_usage_gb") is None
        and case.get("avail_mem_before_load_gb") is None
        and gpu is not None
    ):
        pred_after = gpu.memory_total_gib - gpu.init_overhead_gib - weights
        rows.append(
            {
                "what": "free after weights GiB",
                "predicted": pred_after,
                "measured": case["avail_mem_after_weights_gb"],
                "error": _err(pred_after, case["avail_mem_after_weights_gb"]),
                "note": f"pre = {gpu.key} memory.total - init overhead (gpus.yaml)",
            }
        )
    return rows


def _kv_token_rows(case: dict, spec: dict, arch, layout: Layout, gpu, weights: float,
                   tokens, bytes_per_token: float) -> list[dict]:
    """KV tokens predicted from the case's free-memory figures (derived where the case
    states only some of them) against the tokens it states."""
    after = case.get("avail_mem_after_weights_gb")
    pre = case.get("avail_mem_before_load_gb")
    derived = []
    if pre is None and after is not None and case.get("weights_mem_usage_gb") is not None:
        pre = after + case["weights_mem_usage_gb"]
        derived.append("pre = after + mem usage")
    if after is None and pre is not None:
        after = pre - weights
        derived.append("after = pre - predicted weights")
    mfs = case.get("mem_fraction_static")
    if mfs is None and spec.get("default_mfs") and gpu is not None:
        d = memory_defaults(
            gpu.memory_total_mib,
            MemorySettings(tp=layout.tp,
            attn_dp=layout.attn_dp,
            use_mla=arch.is_mla,
            decode_max_bs=case.get("cuda_graph_max_bs")),
        )
        mfs = d.mem_fraction_static
        derived.append(f"mfs = SGLang 0.5.23 default {mfs} for {gpu.key}")
    if not (tokens and pre is not None and after is not None and mfs is not None):
        return []
    b = budget(
        pre,
        after,
        mfs,
        bytes_per_token,
        fixed_overhead_gib=spec.get("fixed_overhead_gib", 0.0),
    )
    return [
        {
            "what": "KV tokens",
            "predicted": b.kv_tokens or 0,
            "measured": tokens,
            "error": _err(b.kv_tokens or 0, tokens),
            "note": "; ".join(derived),
        }
    ]


def format_table(results: list[CaseResult]) -> str:
    lines = [
        f"{'case':>4}  {'model':<22} {'quantity':<16} {'predicted':>14} {'measured':>14} "
        f"{'error':>8}  note"
    ]
    for r in results:
        if r.status == "skipped":
            lines.append(f"{r.case_id:>4}  {r.model[:22]:<22} skipped: {r.reason}")
            continue
        for row in r.rows:
            note = ("EXCLUDED: " if row.get("excluded") else "") + row.get("note", "")
            lines.append(
                f"{r.case_id:>4}  {r.model[:22]:<22} {row['what']:<16} {row['predicted']:>14,.2f} "
                f"{row['measured']:>14,.2f} {row['error']:>+8.1%}  {note}"
            )
    return "\n".join(lines)
