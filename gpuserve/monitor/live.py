"""Live figures of one SGLang server from its own ``/metrics``: now (running, queued,
KV usage) and over a window between two reads (tok/s, requests, aborted requests,
TTFT and ITL percentiles from the histograms' bucket increases, as Prometheus's
``histogram_quantile`` computes them).

Why two reads and not a Prometheus query: a rolling switch must judge a host with or
without a monitor host, from the hosts' own counters (gpuserve/monitor/live_judge.py).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from gpuserve.parsers.prometheus_text import Sample

TTFT = "sglang:time_to_first_token_seconds_bucket"
ITL = "sglang:inter_token_latency_seconds_bucket"
REQUESTS = "sglang:num_requests_total"
ABORTED = "sglang:num_aborted_requests_total"
GENERATED = "sglang:generation_tokens_total"


@dataclass(frozen=True)
class Snapshot:
    """One read of a server's ``/metrics`` at ``at`` (seconds, monotonic)."""

    at: float
    samples: tuple[Sample, ...]

    def total(self, name: str) -> float:
        """The sum of every series of ``name`` (ranks, streaming or not)."""
        return sum(s.value for s in self.samples if s.name == name and math.isfinite(s.value))

    def peak(self, name: str) -> float | None:
        values = [s.value for s in self.samples if s.name == name and math.isfinite(s.value)]
        return max(values) if values else None

    def buckets(self, name: str) -> dict[float, float]:
        """Cumulative counts per upper bound, summed over the series of ``name``."""
        out: dict[float, float] = defaultdict(float)
        for s in self.samples:
            le = s.label("le") if s.name == name else None
            if le is not None:
                out[math.inf if le == "+Inf" else float(le)] += s.value
        return dict(out)


@dataclass(frozen=True)
class Window:
    """What one host (or several, pooled) served between two reads."""

    seconds: float
    requests: float
    aborted: float
    generated: float
    ttft: dict[float, float] = field(default_factory=dict)  # bucket bound -> increase
    itl: dict[float, float] = field(default_factory=dict)

    @property
    def tok_s(self) -> float:
        return self.generated / self.seconds if self.seconds > 0 else 0.0

    @property
    def error_rate(self) -> float:
        return self.aborted / self.requests if self.requests > 0 else 0.0


def _increase(after: float, before: float) -> float:
    """A counter's increase; a restart (counter lower than before) counts from zero."""
    return after - before if after >= before else after


def window(before: Snapshot, after: Snapshot) -> Window:
    def hist(name: str) -> dict[float, float]:
        old, new = before.buckets(name), after.buckets(name)
        return {le: _increase(count, old.get(le, 0.0)) for le, count in new.items()}

    return Window(seconds=after.at - before.at,
                  requests=_increase(after.total(REQUESTS), before.total(REQUESTS)),
                  aborted=_increase(after.total(ABORTED), before.total(ABORTED)),
                  generated=_increase(after.total(GENERATED), before.total(GENERATED)),
                  ttft=hist(TTFT), itl=hist(ITL))


def pooled(windows: list[Window]) -> Window:
    """Several hosts' windows as one (counts and buckets summed; the longest time)."""
    def merge(parts: list[dict[float, float]]) -> dict[float, float]:
        out: dict[float, float] = defaultdict(float)
        for part in parts:
            for le, count in part.items():
                out[le] += count
        return dict(out)

    return Window(seconds=max((w.seconds for w in windows), default=0.0),
                  requests=sum(w.requests for w in windows),
                  aborted=sum(w.aborted for w in windows),
                  generated=sum(w.generated for w in windows),
                  ttft=merge([w.ttft for w in windows]), itl=merge([w.itl for w in windows]))


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus's ``histogram_quantile`` over cumulative buckets: linear inside the
    bucket the rank falls in; the highest finite bound when it falls in +Inf; None
    without observations."""
    bounds = sorted(buckets)
    if not bounds or bounds[-1] != math.inf:
        return None
    total = buckets[math.inf]
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if bound == math.inf:
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


@dataclass(frozen=True)
class NowFigures:
    """What a single read says of the present."""

    running: float
    queued: float
    kv_usage: float | None


def now(snapshot: Snapshot) -> NowFigures:
    return NowFigures(running=snapshot.total("sglang:num_running_reqs"),
                      queued=snapshot.total("sglang:num_queue_reqs"),
                      kv_usage=snapshot.peak("sglang:token_usage"))
