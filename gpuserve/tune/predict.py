"""A prediction per candidate, to order the measurements and to show its own error.

A decode roofline (weight bytes read per step over the GPU's memory bandwidth) plus the
step's all-reduces at the host's measured latency and bus bandwidth. Why so simple: it
is a ranking aid, never a reason to skip a measurement, and the measured/predicted ratio
printed beside each candidate is its honest error.

How: docs/tune.md, "gpuserve.tune.predict: the roofline and what it leaves out"
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from gpuserve import safeload
from gpuserve.paths import DATA_DIR

GB = 1e9


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
    step_ms: float  # one decode step at batch 1
    comm_ms: float  # of which all-reduce
    note: str = ""

    def to_dict(self) -> dict:
        return {"single_tok_s": round(self.single_tok_s, 2),
                "peak_tok_s": round(self.peak_tok_s, 2), "step_ms": round(self.step_ms, 3),
                "comm_ms": round(self.comm_ms, 3), "note": self.note}


@cache
def bandwidth_gbs(gpu_name: str) -> float | None:
    """Memory bandwidth of ``gpu_name`` (any alias) from gpus.yaml: measured, else the
    datasheet's."""
    from gpuserve.host.gpus import _norm

    data = safeload.load_yaml_file(DATA_DIR / "gpus.yaml")
    want = _norm(gpu_name)
    for key, rec in data["gpus"].items():
        names = [key, rec.get("name", ""), *rec.get("aliases", [])]
        if any(_norm(n) == want for n in names) or _norm(rec.get("name", "")) in want:
            value = rec.get("memory_read_measured_gbs") or rec.get("memory_bandwidth_gbs")
            return float(value) if value else None
    return None


def step_seconds(dense_bytes: float, expert_bytes: float, active: float, batch: int,
                 bandwidth: float, comm_s: float) -> float:
    """One decode step: weights read over bandwidth plus communication."""
    touched = 1.0 - (1.0 - active) ** batch if active < 1 else 1.0
    return (dense_bytes + expert_bytes * touched) / (bandwidth * GB) + comm_s


def predict(*, dense_bytes: float, expert_bytes: float, experts_active: float, layers: int,
            hidden: int, tp: int, attention_dp: int, ep: int, a2a: bool, spec_steps: int,
            gpu_name: str, comm: Comm, peak_batch: int) -> Prediction | None:
    """The roofline of one candidate (bytes per GPU); None without a known bandwidth."""
    bw = bandwidth_gbs(gpu_name)
    if not bw:
        return None
    note = ""

    def comm_s(batch: int) -> float:
        if tp <= 1:
            return 0.0
        lat = (comm.all_reduce_latency_us or 0.0) * 1e-6
        busbw = (comm.all_reduce_busbw_gbs or 0.0) * GB
        per = lat + (batch * hidden * 2 / busbw if busbw else 0.0)
        attn = 0 if attention_dp >= tp else 1
        if a2a and ep > 1:
            a2a_lat = (comm.alltoall_latency_us or comm.all_reduce_latency_us or 0.0) * 1e-6
            return layers * (attn * per + 2 * a2a_lat)
        return layers * (attn + 1) * per

    def tok_s(batch: int) -> tuple[float, float, float]:
        c = comm_s(batch)
        step = step_seconds(dense_bytes, expert_bytes, experts_active, batch, bw, c)
        if spec_steps:
            draft = spec_steps * c  # each draft step adds its all-reduces (draft head ~free)
            per_step_tokens = 1 + 0.5 * spec_steps
            return batch * per_step_tokens / (step + draft), step + draft, c
        return batch / step, step, c

    if not comm.all_reduce_latency_us and tp > 1:
        note = "no measured all-reduce latency: weights only"
    if spec_steps:
        note = (note + "; " if note else "") + "speculative: acceptance assumed 0.5/step"
    single, step, c = tok_s(1)
    peak, _, _ = tok_s(max(1, peak_batch))
    return Prediction(single, peak, step * 1e3, c * 1e3, note)
