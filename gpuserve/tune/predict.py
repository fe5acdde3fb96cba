"""A prediction per candidate, to order the measurements and to show its own error.

The tuner's view of the throughput predictor (gpuserve/throughput/): the candidate's
launch on the host's GPUs, on the link the host measured (NVLink, PCIe with or without
working P2P) at the host's measured all-reduce latency and bus bandwidth. Why a view and
not a model of its own: one predictor, so what ``gpuserve plan`` says of a launch and the
order the tuner loads it in cannot disagree. It is a ranking aid, never a reason to skip
a measurement; the measured/predicted ratio printed beside each candidate is its honest
error.

How: docs/tune.md, "gpuserve.tune.predict: the predictor's view"
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from gpuserve import safeload
from gpuserve.memory.models import ModelArch
from gpuserve.memory.planner import Layout
from gpuserve.paths import DATA_DIR
from gpuserve.throughput.hardware import gpu, link, link_for, measured_link
from gpuserve.throughput.model import Box, Speculation, Workload
from gpuserve.throughput.model import predict as throughput


@dataclass(frozen=True)
class Comm:
    """The host's measured collectives (None where not measured)."""

    all_reduce_latency_us: float | None = None
    all_reduce_busbw_gbs: float | None = None
    alltoall_latency_us: float | None = None


@dataclass(frozen=True)
class Prediction:
    single_tok_s: float  # output tok/s of one stream
    peak_tok_s: float  # output tok/s at the highest load level
    step_ms: float  # one decode step (or speculative cycle) at batch 1
    comm_ms: float  # of which collectives
    note: str = ""

    def to_dict(self) -> dict:
        return {"single_tok_s": round(self.single_tok_s, 2),
                "peak_tok_s": round(self.peak_tok_s, 2), "step_ms": round(self.step_ms, 3),
                "comm_ms": round(self.comm_ms, 3), "note": self.note}


@cache
def bandwidth_gbs(gpu_name: str) -> float | None:
    """Memory bandwidth of ``gpu_name`` (any alias) from gpus.yaml: measured, else the
    datasheet's."""
    from gpuserve.host.gpus import norm_name

    data = safeload.load_yaml_file(DATA_DIR / "gpus.yaml")
    want = norm_name(gpu_name)
    for key, rec in data["gpus"].items():
        names = [key, rec.get("name", ""), *rec.get("aliases", [])]
        if any(norm_name(n) == want for n in names) or norm_name(rec.get("name", "")) in want:
            value = rec.get("memory_read_measured_gbs") or rec.get("memory_bandwidth_gbs")
            return float(value) if value else None
    return None


def host_box(gpu_name: str, comm: Comm, measured: dict | None) -> Box | None:
    """The host as the predictor sees it: its GPU, the link class its measured gates
    name (P2P only where measured working), their figures in place of the class's."""
    card = gpu(gpu_name)
    if card is None:
        return None
    measured = measured if isinstance(measured, dict) else {}
    name = link_for(nvlink=card.nvlink, p2p=measured.get("p2p") is True, card=card)
    return Box(card, measured_link(link(name), latency_us=comm.all_reduce_latency_us,
                                   busbw_gbs=comm.all_reduce_busbw_gbs,
                                   alltoall_latency_us=comm.alltoall_latency_us))


def predict(*, arch: ModelArch, layout: Layout, spec: Speculation | None, kv_dtype: str,
            box: Box | None, peak_batch: int, parts: list | None = None) -> Prediction | None:
    """One candidate's single-stream and peak-load output tok/s on the host ``box``
    (:func:`host_box`; None without a known GPU bandwidth, and then no prediction);
    ``parts``: the checkpoint's weights per GPU, else the record's."""
    if box is None:
        return None
    single = throughput(arch, layout, box, Workload(1), kv_dtype=kv_dtype, spec=spec,
                        parts=parts)
    peak = throughput(arch, layout, box, Workload(max(1, peak_batch)), kv_dtype=kv_dtype,
                      spec=spec, parts=parts)
    notes = []
    if not box.link.measured and layout.tp > 1:
        notes.append(f"no measured all-reduce: {box.link.name} defaults")
    if spec is not None:
        notes.append(f"speculative: accept length {single.accept_length:.2f} assumed")
    return Prediction(single.single_stream_tps, peak.output_tps, single.step_ms,
                      single.comm_ms, "; ".join(notes))
