"""``gpuserve plan``'s throughput: the options, the box a plan assumes, and calibration by
bench records given to ``--calibrate``.

Why here: the plan command only wires options to it; the tuner and the accuracy bench
use the same model and the same calibration.

How: docs/planner.md, "Throughput predictor".
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from gpuserve.errors import InputError
from gpuserve.memory.models import ModelArch
from gpuserve.memory.planner import Layout
from gpuserve.throughput.hardware import LINKS, gpu, link, link_for, measured_link
from gpuserve.throughput.model import Box, Speculation, Workload, predict
from gpuserve.throughput.records import (
    Case,
    case_from_row,
    fit,
    is_bench_file,
    measured_tps,
    read_rows,
)


def register_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The throughput options of ``gpuserve plan`` (``--calibrate`` is shared with the
    memory calibration: added here only when not already there); returns ``p``."""
    g = p.add_argument_group("throughput")
    g.add_argument("--concurrency", type=int, default=1,
                   help="requests in flight for the predicted output tok/s (default 1)")
    g.add_argument("--input-len", dest="input_len", type=int, default=1024,
                   help="prompt tokens per request (default 1024; 0: decode only)")
    g.add_argument("--output-len", dest="output_len", type=int, default=1024,
                   help="generated tokens per request (default 1024)")
    g.add_argument("--interconnect", choices=LINKS,
                   help="the box's GPU link (default: nvlink for SXM parts, else PCIe "
                   "without P2P until the host measured it)")
    if "--calibrate" not in p._option_string_actions:
        p.add_argument("--calibrate", action="append", metavar="FILE",
                       help="a host's measurement: bench records (JSONL) calibrate the "
                       "throughput prediction; repeatable")
    return p


@dataclass
class Launch:
    """What the predictor needs of one launch."""

    layout: Layout
    spec: Speculation | None
    kv_dtype: str
    max_running: int | None


def launch_of(prof: Any, settings: Any) -> Launch:
    """The predictor's view of a profile's launch settings (gpuserve.memory.preflight)."""
    algo = settings.layout.speculative
    spec = None
    if algo and algo.upper() != "NONE":
        s = prof.speculative if prof is not None else None
        steps = (s.num_steps if s else None) or 3
        spec = Speculation(algo.upper(), steps, (s.eagle_topk if s else None) or 1,
                           (s.num_draft_tokens if s else None) or steps + 1)
    knobs = settings.knobs
    return Launch(settings.layout, spec, str(knobs.get("kv_cache_dtype") or "auto"),
                  knobs.get("max_running_requests"))


def box_for(gpu_key: str, interconnect: str | None, prof: Any) -> Box:
    """The box a plan assumes: ``--interconnect``, else NVLink where the GPU has it,
    else PCIe without P2P (not measured: as the gates treat it)."""
    card = gpu(gpu_key)
    if card is None:
        raise InputError("--gpus", "gpus", f"{gpu_key}: no memory bandwidth in gpus.yaml, "
                         "no throughput to predict")
    nodes = prof.parallel.nnodes if prof is not None else 1
    name = interconnect or link_for(nvlink=card.nvlink, p2p=None, nodes=nodes, card=card)
    return Box(card, link(name))


def predicted(args: argparse.Namespace, prof: Any, arch: ModelArch, settings: Any,
              gpu_key: str) -> dict:
    """The ``predicted`` block of ``gpuserve plan --json``."""
    for flag in ("concurrency", "input_len", "output_len"):
        value = getattr(args, flag, None)
        if value is not None and value < (1 if flag != "input_len" else 0):
            raise InputError("--" + flag.replace("_", "-"), flag, f"must be positive, got {value}")
    launch = launch_of(prof, settings)
    box = box_for(gpu_key, getattr(args, "interconnect", None), prof)
    work = Workload(getattr(args, "concurrency", 1) or 1, getattr(args, "input_len", 1024),
                    getattr(args, "output_len", 1024), max_running=launch.max_running)
    files = [f for f in (getattr(args, "calibrate", None) or []) if is_bench_file(f)]
    calibrated = None
    if files:
        box, calibrated = calibrate(files, arch, box, prof)
    p = predict(arch, launch.layout, box, work, kv_dtype=launch.kv_dtype, spec=launch.spec)
    doc = p.to_dict()
    doc["calibrated_by"] = calibrated
    return doc


#: gpuserve.measure/1 topology classes (gpuserve.measure.gates) -> link classes
_GATE_LINKS = {"nvlink4": "nvlink", "nvlink-other": "nvlink", "pcie5-x16-p2p": "pcie-p2p",
               "pcie-p2p": "pcie-p2p", "pcie-no-p2p": "pcie-no-p2p"}


def calibrate(files: list[str], arch: ModelArch, box: Box, prof: Any) -> tuple[Box, dict]:
    """``box`` calibrated by the records: the host's newest measured gates
    (``gpuserve.measure/1`` lines: its topology class and all-reduce figures), then the
    baseline among the bench records, a measurement without speculation of the same model
    on this GPU (this profile's own first, then one of the same TP), planned on this box:
    its measured/predicted is the box's factor."""
    rows = [row for name in files for row in read_rows(name)]
    info: dict[str, Any] = {}
    gates = sorted((r for r in rows if r.get("schema") == "gpuserve.measure/1"),
                   key=lambda r: str(r.get("timestamp") or ""))
    if gates:
        box, info["gates"] = _gated(box, gates[-1])
    cases = [c for c in (_case(r, arch, box) for r in rows if "schema" not in r) if c]
    if not cases:
        if gates:
            return box, info
        raise InputError(files[0], "records", f"no bench record of {arch.name} without "
                         "speculation on this GPU to calibrate by")
    me = prof.name if prof is not None else None

    def rank(c: Case) -> tuple:
        return (c.row.get("profile") != me, c.layout.tp != box_tp(prof), c.row["_line"])

    best = sorted(cases, key=rank)[0]
    fitted = fit(best)
    info.update({"record": best.row.get("id"), "measured_tps": best.measured,
                 "factor": round(1 / fitted.scale, 4)})
    return fitted, info


def _gated(box: Box, doc: dict) -> tuple[Box, dict]:
    """``box`` on the link a measure record's topology class names, at its figures."""
    figures = doc.get("figures") if isinstance(doc.get("figures"), dict) else {}

    def first(prefix: str) -> float | None:
        return next((float(v) for k, v in figures.items() if str(k).startswith(prefix)
                     and isinstance(v, int | float) and not isinstance(v, bool)), None)

    name = _GATE_LINKS.get(str(doc.get("topology_class")), box.link.name)
    measured = measured_link(link(name), latency_us=first("all_reduce_latency@"),
                             busbw_gbs=first("all_reduce_busbw@"),
                             alltoall_latency_us=first("alltoall_latency@"))
    return Box(box.gpu, measured, box.scale), {
        "host": doc.get("host"), "timestamp": doc.get("timestamp"), "link": name,
        "measured": list(measured.measured)}


def box_tp(prof: Any) -> int:
    """The profile's tensor-parallel size (1 without a profile)."""
    return prof.parallel.tp if prof is not None else 1


def _case(row: dict, arch: ModelArch, box: Box) -> Case | None:
    """A calibration row as a case on ``box`` (None: another model, GPU, or speculative)."""
    if row.get("profile"):
        from gpuserve.launch.profiles import load_profile
        from gpuserve.memory.preflight import launch_settings

        try:
            prof = load_profile(row["profile"])
        except InputError:
            return None  # a label without a profile file (the notes' 512-graph run)
        if (prof.model.arch or "") != arch.name:
            return None
        launch = launch_of(prof, launch_settings(prof))
        tps = measured_tps(row)
        if launch.spec is not None or tps is None:
            return None
        work = Workload(int(row.get("concurrency") or 1), int(row.get("input_len") or 1024),
                        int(row.get("output_len") or 1024), max_running=launch.max_running)
        return Case(row, arch, launch.layout, box, work, None, launch.kv_dtype, tps)
    case = case_from_row(row)
    if isinstance(case, str) or case.spec is not None or case.arch.name != arch.name:
        return None
    return case if case.box.gpu.key == box.gpu.key else None
