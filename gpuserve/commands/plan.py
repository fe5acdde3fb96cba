"""``gpuserve plan``: predict whether a launch fits in GPU memory, or diagnose a startup log.

Predict: ``gpuserve plan --model glm-5-nvfp4 --gpus 8xRTX-PRO-6000 --tp 8`` (or
``--profile glm5-nvfp4-tp8``) reproduces SGLang's default mem_fraction_static, weights per
GPU, KV bytes per token and KV tokens, then says what to change when it does not fit.
Checkpoint: ``--model-dir DIR`` reads the local checkpoint's config.json and safetensors
headers and plans with its real weights per GPU ("(from checkpoint)"), comparing them with
the profile's model record. A launch that does not fit is shown with its verdict
(refused / no-kv) and the mem_fraction_static or graph max bs that would fit; as for every
prediction the exit status is 0 unless the layout is invalid (2) or the input is bad (2).
Calibrate: ``--calibrate server.log`` (a startup log of the same checkpoint and version)
plans from what that start measured: its free memory after weights plus the planner's
delta between the two launches, with an uncertainty (gpuserve.memory.calibration);
without it, the real starts the model record quotes are checked, and a launch they
disagree about is "risky" (exit status 0 too: a prediction, not a refusal).
Diagnose: ``gpuserve plan --log server.log`` reads the free-memory figures SGLang printed and
explains the outcome with the same arithmetic. Both print a table, or JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

from gpuserve import versions
from gpuserve.errors import InputError
from gpuserve.host.gpus import parse_gpus
from gpuserve.memory.calibration import calibrate_or_check
from gpuserve.memory.checkpoint import checkpoint_weights, scan_directory, unrecognised
from gpuserve.memory.draft import Draft, resolve_draft
from gpuserve.memory.measured import MeasuredStart
from gpuserve.memory.memory_defaults import DEFAULT_VERSION, KNOWN_VERSIONS
from gpuserve.memory.models import load_record, resolve_model
from gpuserve.memory.planner import (
    GIB,
    FitVerdict,
    Layout,
    PlanRequest,
    kv_cell,
    predict,
    resolve_kv_dtype,
    weights_per_gpu,
)
from gpuserve.memory.preflight import launch_settings
from gpuserve.memory.startup_log import diagnose, read_log
from gpuserve.table import table as fixed_width
from gpuserve.terminal import printable
from gpuserve.throughput.plan import register_args


def finite_float(text: str) -> float:
    """``float`` for argparse that refuses ``nan``/``inf`` (which ``float()`` accepts):
    NaN passes every range check and inf breaks the planner's arithmetic."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r:.40}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r:.40}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="predict GPU memory for a launch, or diagnose an SGLang startup log",
        description="Predict SGLang's memory budget (weights, KV cache, default "
        "mem_fraction_static) for a model on a GPU box, or explain a startup log's outcome.",
    )
    p.add_argument(
        "--model",
        help="model record name (see gpuserve/data/models) or a directory holding config.json",
    )
    p.add_argument(
        "--model-dir",
        dest="model_dir",
        help="a local checkpoint: plan with the weights its safetensors headers hold",
    )
    p.add_argument(
        "--hf",
        help="a Hub checkpoint, org/name@revision: plan with the weights its safetensors "
        "headers hold, read remotely (about 100 KB a shard, no weights fetched; the token "
        "comes from $HF_TOKEN)",
    )
    p.add_argument("--hf-endpoint", dest="hf_endpoint",
                   help="the Hub or a mirror (default: $HF_ENDPOINT, else huggingface.co)")
    p.add_argument("--gpus", help="COUNTxGPU, e.g. 8xRTX-PRO-6000, 8xH200")
    p.add_argument("--profile", help="launch profile (name or path); CLI flags override it")
    p.add_argument("--log", help="diagnose this SGLang startup log instead of predicting")
    add_calibrate(p)
    p.add_argument(
        "--sglang-version",
        dest="sglang_version",
        help=f"memory rules of this SGLang version ({', '.join(KNOWN_VERSIONS)})",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    g = p.add_argument_group("overrides")
    g.add_argument("--tp", type=int)
    g.add_argument("--ep", type=int)
    g.add_argument("--attn-dp", dest="attn_dp", type=int)
    g.add_argument("--mem-fraction-static", dest="mem_fraction_static", type=finite_float)
    g.add_argument("--kv-cache-dtype", dest="kv_cache_dtype")
    g.add_argument("--cuda-graph-max-bs", dest="cuda_graph_max_bs", type=int)
    g.add_argument("--chunked-prefill-size", dest="chunked_prefill_size", type=int)
    g.add_argument("--context-length", dest="context_length", type=int)
    g.add_argument("--max-running-requests", dest="max_running_requests", type=int)
    g.add_argument("--moe-a2a-backend", dest="moe_a2a_backend")
    g.add_argument("--num-redundant-experts", dest="num_redundant_experts", type=int)
    g.add_argument(
        "--speculative", help="speculative algorithm (NEXTN/EAGLE use the checkpoint's MTP layers)"
    )
    g.add_argument(
        "--draft-weights-gib",
        dest="draft_weights_gib",
        type=finite_float,
        help="weights of a separate draft model per GPU (EAGLE3 heads)",
    )
    g.add_argument(
        "--draft-arch",
        dest="draft_arch",
        help="the separate draft's record (gpuserve/data/models/drafts/; default: the "
        "profile's speculative.draft_arch): its weights, KV and CUDA graphs are planned",
    )
    g.add_argument(
        "--draft-dir",
        dest="draft_dir",
        help="the separate draft's local checkpoint directory: its weights from the "
        "safetensors headers",
    )
    g.add_argument(
        "--pre-load-free-gib",
        dest="pre_load_free_gib",
        type=finite_float,
        help="measured 'Load weight begin. avail mem' (default: GPU spec)",
    )
    g.add_argument("--a2a-buffer-gib", dest="a2a_buffer_gib", type=finite_float)
    g.add_argument(
        "--dsa-backend",
        dest="dsa_backend",
        help="DSA attention backend (decides the DSA KV layout)",
    )
    register_args(p).set_defaults(func=run)


def add_calibrate(p: argparse.ArgumentParser) -> None:
    """``--calibrate FILE``, repeatable: a startup log (memory) or bench records (JSONL,
    throughput) a host measured."""
    p.add_argument(
        "--calibrate", action="append", metavar="FILE",
        help="a host's measurement: an SGLang startup log of the same checkpoint and version "
        "(its free memory after weights calibrates the plan; the last log given is used), "
        "or bench records (JSONL); repeatable",
    )


def run(args: argparse.Namespace) -> int:
    check_overrides(args)
    if args.log:
        return _run_log(args)
    try:
        return _run_predict(args)
    except InputError as exc:
        if exc.file is not None or not exc.field:
            raise
        # the planner knows the field, not where it came from: the flag, else the profile
        flag = "--" + exc.field.replace("_", "-")
        where = flag if getattr(args, exc.field, None) is not None else (
            args.profile or "--model")
        raise InputError(where, exc.field, exc.message) from None


def _run_log(args: argparse.Namespace) -> int:
    log = read_log(args.log)
    d = diagnose(
        log, mem_fraction_static=args.mem_fraction_static, pre_load_free_gib=args.pre_load_free_gib
    )
    if args.model:
        sm_major = parse_gpus(args.gpus)[1].sm_major if args.gpus else None
        d.lines.extend(model_lines(log, d, resolve_model(args.model), sm_major))
    if args.json:
        print(json.dumps({"log": log.to_dict(), "diagnosis": d.to_dict()}, indent=2))
        return 0
    print(f"log {printable(args.log)}: {d.outcome}")
    print_diagnosis(d)
    return 0


def print_diagnosis(d: Any) -> None:
    """A startup-log diagnosis's figures, findings and fixes (also ``gpuserve logs``)."""
    rows = [
        ("free before weights (GiB)", d.pre_load_free_gib),
        ("free after weights (GiB)", d.avail_after_weights_gib),
        ("weights (GiB)", d.weights_gib),
        ("mem_fraction_static", d.mem_fraction_static),
        ("slack pre x (1 - mfs) (GiB)", d.slack_gib),
        ("rest for KV (GiB)", d.rest_gib),
        ("minimum viable mfs", d.min_viable_mfs),
        ("KV tokens", d.kv_tokens),
        ("KV pool (GiB)", d.kv_gib),
        ("KV bytes/token", d.kv_bytes_per_token),
        ("CUDA graphs (GiB)", d.graph_gib),
    ]
    _table(rows)
    for line in d.lines:
        print(f"  - {line}")
    for r in d.rules:  # the doctor rules the crash texts stand for; their fixes lead below
        print(f"{r['severity'].upper()} {r['id']}: {r['title']}")
        print(f"    saw:    {r['evidence']}")
        print(f"    source: {r['source']}")
    if d.fixes:
        print("fixes:")
        for fix in d.fixes:
            print(f"  * {fix}")


_TORCH_KV = {
    "torch.bfloat16": "bf16",
    "torch.float16": "fp16",
    "torch.float8_e4m3fn": "fp8_e4m3",
    "torch.float8_e5m2": "fp8_e5m2",
}


def model_lines(log: Any, d: Any, arch: Any, sm_major: int | None) -> list[str]:
    """What the model record adds to a log diagnosis: expected weights and KV tokens."""
    sa = log.server_args
    tp = int(sa.get("tp_size") or 1)
    attn_dp = int(sa.get("attn_dp_size") or 1)
    if attn_dp == 1 and str(sa.get("enable_dp_attention")) == "True":
        attn_dp = int(sa.get("dp_size") or 1)
    layout = Layout(
        tp=tp,
        ep=int(sa.get("ep_size") or 1),
        attn_dp=attn_dp,
        moe_a2a_backend=str(sa.get("moe_a2a_backend") or "none"),
    )
    out = []
    weights = sum(p.gib for p in weights_per_gpu(arch, layout))
    if d.weights_gib:
        out.append(
            f"{arch.name} predicts {weights:.2f} GiB of weights per GPU at tp {tp}, "
            f"ep {layout.ep}; the log shows {d.weights_gib:.2f} GiB in use after loading "
            f"({d.weights_gib - weights:+.2f} GiB not explained by the weights)"
        )
    logged = next((r.kv_dtype for r in log.ranks.values() if r.kv_dtype), None)
    kv_dtype = str(sa.get("kv_cache_dtype") or _TORCH_KV.get(logged or "", "auto"))
    kv_dtype = resolve_kv_dtype(arch, kv_dtype)
    cell = kv_cell(arch, kv_dtype=kv_dtype, attn_tp=layout.attn_tp, sm_major=sm_major)
    if d.rest_gib is not None and d.rest_gib > 0:
        tokens = int(d.rest_gib * GIB) // cell.bytes_per_token
        line = f"{cell.bytes_per_token:,} B/token ({kv_dtype}): about {tokens:,} KV tokens"
        if d.kv_tokens:
            line += f" (log: {d.kv_tokens:,})"
        out.append(line)
    return out


# Overrides and the smallest value each accepts (as the profile schema and SGLang do).
_AT_LEAST = {
    "tp": 1, "ep": 1, "attn_dp": 1, "cuda_graph_max_bs": 1, "context_length": 1,
    "max_running_requests": 1, "num_redundant_experts": 0, "draft_weights_gib": 0,
    "pre_load_free_gib": 0, "a2a_buffer_gib": 0,
}


def check_overrides(args: argparse.Namespace) -> None:
    """Refuse override values SGLang would refuse, naming the flag (before any arithmetic)."""
    for dest, low in _AT_LEAST.items():
        value = getattr(args, dest, None)
        if value is not None and value < low:
            flag = "--" + dest.replace("_", "-")
            raise InputError(flag, dest, f"must be at least {low}, got {value}")
    mfs = args.mem_fraction_static
    if mfs is not None and not 0 < mfs < 1:
        raise InputError("--mem-fraction-static", "mem_fraction_static",
                         f"must be in (0, 1), got {mfs}")
    for dest in ("kv_cache_dtype", "moe_a2a_backend"):
        value = getattr(args, dest, None)
        choices = catalog_choices("--" + dest.replace("_", "-"))
        if value is not None and value not in choices:
            # free text reached the planner: an unknown backend was planned as "none"
            raise InputError("--" + dest.replace("_", "-"), dest, f"{value!r:.40} is not a "
                             f"choice of SGLang's (known: {', '.join(choices)})")
    cps = args.chunked_prefill_size
    if cps is not None and cps != -1 and cps < 1:
        raise InputError("--chunked-prefill-size", "chunked_prefill_size",
                         f"must be a positive size or -1 (off), got {cps}")


def catalog_choices(flag: str) -> list[str]:
    """Every value SGLang's parser accepts for ``flag`` in any committed flag catalog."""
    from gpuserve.launch.catalog import available_versions, load_catalog

    found: dict[str, None] = {}
    for version in available_versions():
        for option in load_catalog(version).options:
            if flag in option.flags:
                found.update(dict.fromkeys(option.choices or ()))
    return list(found)


_OVERRIDES = (
    "tp", "ep", "attn_dp", "moe_a2a_backend", "num_redundant_experts", "speculative",
    "mem_fraction_static", "kv_cache_dtype", "cuda_graph_max_bs", "chunked_prefill_size",
    "max_running_requests", "context_length", "dsa_backend",
)


def _run_predict(args: argparse.Namespace) -> int:
    prof = None
    if args.profile:
        from gpuserve.launch.profiles import load_profile

        prof = load_profile(args.profile)
    if not args.gpus:
        raise InputError("--gpus", "gpus", "give the GPUs, e.g. --gpus 8xRTX-PRO-6000")
    count, gpu = parse_gpus(args.gpus)
    scan = scan_directory(args.model_dir) if args.model_dir else None
    if getattr(args, "hf", None):
        scan = remote_scan(args.hf, args.hf_endpoint)
    if scan is not None:
        arch = scan.arch()
        record_name = args.model or (prof.model.arch if prof else None)
        record = load_record(record_name) if record_name else None
    else:
        arch, record = _arch_from_args(args, prof), None
    version = args.sglang_version or _profile_version(prof) or DEFAULT_VERSION
    overrides = {k: getattr(args, k, None) for k in _OVERRIDES}
    overrides["tp"] = default_tp(args.tp, prof, count)
    settings = launch_settings(prof, overrides)
    if overrides["tp"] != args.tp:
        settings = dataclasses.replace(settings, layout=whole_experts_if_needed(
            settings.layout, arch, told_ep=args.ep))
        print(f"tp {settings.layout.tp} (one rank per GPU of --gpus {args.gpus}; --tp to "
              "change)" + (f", ep {settings.layout.ep} (whole experts: the model's fp8 "
                           "blocks do not split over tp; --ep to change)"
                           if settings.layout.ep > 1 and args.ep is None else ""),
              file=sys.stderr)
    def plan_for(chosen: Any) -> Any:
        """The planner on ``chosen`` (LaunchSettings) with this command's inputs."""
        parts = checkpoint_weights(scan, chosen.layout, arch) if scan is not None else None
        return predict(
            arch,
            PlanRequest(gpu_memory_mib=gpu.memory_total_mib,
            gpu_name=gpu.key,
            gpu_count=count,
            sm_major=gpu.sm_major,
            init_overhead_gib=gpu.init_overhead_gib,
            layout=chosen.layout,
            version=version,
            pre_load_free_gib=args.pre_load_free_gib,
            a2a_buffer_gib=args.a2a_buffer_gib,
            draft_weights_gib=(args.draft_weights_gib or 0.0) if chosen.layout.speculative else 0.0,
            weight_parts=parts,
            weights_from=f"checkpoint {scan.directory}" if scan is not None else None,
            record=record,
            draft=_draft(args, prof, chosen.layout)
            if chosen.layout.speculative or chosen is settings else None,
            **chosen.knobs),
        )

    plan = _measured_or_records(args, prof, plan_for(settings), settings, plan_for,
                                record or arch)
    if args.json:
        speed = _throughput(args, prof, arch, settings, gpu.key)
        print(json.dumps({**plan.to_dict(), "predicted": speed}, indent=2))
        return 0 if plan.verdict != FitVerdict.INVALID else 2
    _print_plan(plan, arch)
    _print_throughput(_throughput(args, prof, arch, settings, gpu.key))
    if scan is not None:
        unknown = unrecognised(scan, arch)
        if unknown:
            print(f"unrecognised tensors (counted as replicated): {', '.join(unknown)}")
    return 0 if plan.verdict != FitVerdict.INVALID else 2


def _throughput(args: argparse.Namespace, prof: Any, arch: Any, settings: Any,
                gpu_key: str) -> dict | None:
    """The predicted output tok/s (gpuserve.throughput), or None where the GPU has no
    memory bandwidth on record."""
    from gpuserve.throughput.hardware import gpu as throughput_gpu
    from gpuserve.throughput.plan import predicted

    if throughput_gpu(gpu_key) is None:
        return None
    return predicted(args, prof, arch, settings, gpu_key)


def _print_throughput(speed: dict | None) -> None:
    if not speed:
        return
    cal = speed.get("calibrated_by") or {}
    how = [f"by the gates of {cal['gates']['host']} at {cal['gates']['timestamp']}"] \
        if cal.get("gates") else []
    if cal.get("record"):
        how.append(f"x{cal['factor']:.3g} by {cal['record']} at {cal['measured_tps']:g} tok/s")
    said = "calibrated " + ", ".join(how) if how else "uncalibrated"
    print(f"throughput ({speed['link']}, {said}):")
    _table([
        ("single stream (tok/s)", speed["single_stream_tps"]),
        (f"output at concurrency {speed['concurrency']} (tok/s)", speed["output_tps"]),
        ("per user (tok/s)", speed["per_user_tps"]),
        ("collectives per forward", speed["collectives_per_forward"]),
        ("accept length", speed["accept_length"]),
    ])
    for note in speed["notes"]:
        print(f"  - {note}")


def _draft(args: argparse.Namespace, prof: Any, layout: Layout) -> Draft | None:
    """The separate draft to plan: ``--draft-dir`` scanned, else ``--draft-arch`` or the
    profile's ``speculative.draft_arch`` record."""
    if (args.draft_dir or args.draft_arch) and not layout.speculative:
        raise InputError("--draft-dir" if args.draft_dir else "--draft-arch", "speculative",
                         "a draft needs a speculative algorithm (--speculative EAGLE3)")
    scan = scan_directory(args.draft_dir) if args.draft_dir else None
    record = args.draft_arch or (prof.speculative.draft_arch if prof else None)
    return resolve_draft(layout.speculative, layout=layout, draft_arch=record, scan=scan)


def default_tp(tp: int | None, prof: Any, gpu_count: int) -> int | None:
    """The tensor-parallel size to plan: ``--tp``, else the profile's, else one rank per
    GPU of ``--gpus`` (a box of 8 is planned as TP8, the layout SGLang users launch on
    it; TP1 on 8 GPUs planned one GPU's worth and refused models that fit)."""
    if tp is not None or prof is not None:
        return tp
    return gpu_count


def whole_experts_if_needed(layout: Layout, arch: Any, *, told_ep: int | None) -> Layout:
    """The defaulted layout with ep = tp when SGLang would refuse the TP-only one and
    accepts whole experts (block-wise fp8 MoE whose expert slice is not a whole block:
    Qwen3-235B-A22B-FP8 at TP8), as its model cards launch it; otherwise unchanged."""
    if told_ep is not None or not layout.validate(arch):
        return layout
    whole = dataclasses.replace(layout, ep=layout.tp)
    return whole if not whole.validate(arch) else layout


def _arch_from_args(args: argparse.Namespace, prof: Any) -> Any:
    """The model record (or config.json directory) named by --model or the profile."""
    model = args.model or (prof and (prof.model.arch or prof.model.path))
    if not model:
        raise InputError(
            args.profile or "--model",
            "model.arch",
            "give --model (a record name or a model directory), --model-dir, or a profile "
            "with model.arch",
        )
    if args.model or prof is None:
        return resolve_model(model)
    try:
        return resolve_model(model)
    except InputError as exc:
        # the model came from the profile: point at it, not at a --model never given
        field = "model.arch" if prof.model.arch else "model.path"
        raise prof.error(field, f"{exc.message}; set model.arch to a record, or pass "
                         "--model") from None


def remote_scan(spec: str, endpoint: str | None) -> Any:
    """The scan of a Hub checkpoint from its headers (gpuserve/memory/remote.py): the
    same document a local directory gives, so the same planner path follows."""
    import os

    from gpuserve.launch.hf_source import parse_source, source_problem
    from gpuserve.memory.checkpoint import parse_scan
    from gpuserve.memory.remote import Where, read_remote

    problem = source_problem(spec, allow_floating=True)
    if problem:
        raise InputError("--hf", "hf", problem)
    endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None
    where = Where("--hf", "hf", "--hf-endpoint", "hf_endpoint", endpoint)
    found = read_remote(parse_source(spec, True), where, os.environ.get("HF_TOKEN") or None,
                        headers=True, files=False)
    shards = len((found.scan or {}).get("files") or [])
    print(f"{found.source.repo_id}@{found.commit}: weights planned from the safetensors "
          f"headers of {shards} files only (no weights fetched)", file=sys.stderr)
    return parse_scan(found.scan_json(), f"hf:{found.source.repo_id}@{found.commit}")


def _measured_or_records(args: argparse.Namespace, prof: Any, plan: Any, settings: Any,
                         plan_for: Any, record: Any) -> Any:
    """``plan`` calibrated by the last startup log ``--calibrate`` names, else checked
    against the real starts its model record quotes (gpuserve.memory.calibration)."""
    measured = calibration_start(args.calibrate or [])
    plan, why = calibrate_or_check(
        plan, record=record, measured=measured, checkpoint=prof.model.path if prof else None,
        replan=lambda layout: plan_for(dataclasses.replace(settings, layout=layout)))
    if why:
        raise InputError(measured.source, "checkpoint", f"cannot calibrate this launch: {why}")
    return plan


def calibration_start(files: list[str]) -> MeasuredStart | None:
    """The last startup log among ``--calibrate`` files as a measured start; a file whose
    first non-empty line starts with ``{`` holds bench records (JSONL), not read here."""
    found = None
    for name in files:
        try:
            text = Path(name).read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            raise InputError(name, None, f"cannot read: {e.strerror or e}") from None
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        if first.startswith("{"):
            continue
        found = MeasuredStart.from_log(text, name)
    return found


def _profile_version(prof: Any) -> str | None:
    if prof is None or not prof.sglang_versions:
        return None
    known = [v for v in prof.sglang_versions if v in KNOWN_VERSIONS]
    return versions.newest(known) if known else None


def _shown(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.4f}" if abs(value) < 2 else f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _table(rows: list[tuple[str, Any]]) -> None:
    for line in fixed_width([(key, _shown(value)) for key, value in rows], rule=False,
                            free_last=True, indent="  "):
        print(line)


def _print_calibrated(c: dict | None) -> None:
    """The plan from a host's measured start: its figures and where they came from."""
    if not c:
        return
    print(f"calibrated by the measured start {c['source']}:")
    _table([
        ("measured free after weights", c["measured_after_gib"]),
        ("planned delta (GiB)", c["planned_delta_gib"]),
        ("free after weights (GiB)", c["free_after_weights_gib"]),
        ("free before weights (GiB)", c["free_before_weights_gib"]),
        ("rest for KV / margin (GiB)", c["rest_gib"]),
        ("uncertainty (GiB)", c["uncertainty_gib"]),
        ("KV tokens", c["kv_tokens"]),
        ("minimum viable mfs", c["min_viable_mfs"]),
        ("mfs clearing the uncertainty", c["safe_mfs"]),
    ])


def _print_plan(plan: Any, arch: Any) -> None:
    lay = plan.layout
    print(
        f"{plan.model} on {plan.gpus}x{plan.gpu}, SGLang {plan.version}: tp {lay['tp']}, "
        f"ep {lay['ep']}, attn-dp {lay['attn_dp']}, a2a {lay['moe_a2a_backend']}"
    )
    print(
        f"  {arch.attention.upper()} {'MoE' if arch.is_moe else 'dense'}, {arch.num_layers} "
        f"layers, weights {arch.quant_label}"
        + (
            f" (kept full precision: {', '.join(arch.unquantized_parts())})"
            if arch.quantization
            else ""
        )
    )
    d = plan.defaults
    _table(
        [
            ("chunked_prefill_size", d["chunked_prefill_size"]),
            ("decode cuda graph max bs", d["decode_max_bs"]),
            ("mem_fraction_static", plan.mem_fraction_static),
            ("free before weights (GiB)", plan.pre_load_free_gib),
        ]
    )
    source = getattr(plan, "weights_from", "model record")
    print("weights per GPU" + (" (from checkpoint):" if source.startswith("checkpoint") else ":"))
    parts = [(w["part"], f"{w['gib']:.2f} GiB", w["how"]) for w in plan.weights]
    for line in fixed_width([*parts, ("total", f"{plan.weights_gib:.2f} GiB", "")], rule=False,
                            right={1}, free_last=True, indent="  "):
        print(line.rstrip())
    _table(
        [
            ("free after weights (GiB)", plan.avail_after_weights_gib),
            ("rest for KV (GiB)", plan.rest_gib),
            ("KV bytes/token", plan.kv_cell["bytes_per_token"]),
            ("KV tokens", plan.kv_tokens),
            ("context length", plan.context_length),
            ("max running requests", plan.max_running_requests),
            ("minimum viable mfs", plan.min_viable_mfs),
            ("max safe mfs", plan.max_safe_mfs),
        ]
    )
    _print_calibrated(plan.calibrated)
    print(f"verdict: {plan.verdict}")
    for p in plan.problems:
        print(f"  ! {p}")
    for line in plan.explanation:
        print(f"  - {line}")
    if plan.changes:
        print("changes:")
        for c in plan.changes:
            print(f"  * {c}")
