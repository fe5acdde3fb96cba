"""Metrics, report and result line of the benchmark client, with the real definitions.

Follows sglang/benchmark/serving.py (0.5.23) ``calculate_metrics`` and the printing and
``result`` dict at the end of ``benchmark``: TTFT and ITL from chunk arrival times, TPOT =
(latency - ttft) / (output_len - 1), concurrency = sum(e2e) / duration, percentiles as
numpy's default (linear interpolation), std as numpy's (population). The stand-in
counts "retokenized" output tokens as words (its server sends one word per token).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class RequestOutput:
    """sglang/benchmark/serving.py::RequestFuncOutput (the fields the metrics use)."""

    generated_text: str = ""
    success: bool = False
    latency: float = 0.0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_len: int = 0
    error: str = ""
    output_len: int = 0
    start_time: float = 0.0


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def std(xs: list[float]) -> float:
    if not xs:
        return math.nan
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def percentile(xs: list[float], q: float) -> float:
    """numpy.percentile's default ('linear')."""
    if not xs:
        return math.nan
    s = sorted(xs)
    k = (len(s) - 1) * q / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _stats(prefix: str, xs: list[float], *, or_zero: bool) -> dict[str, float]:
    # serving.py uses ``np.mean(ttfts or 0)``: an empty list counts as [0].
    data = xs or ([0.0] if or_zero else [])
    return {f"mean_{prefix}_ms": mean(data) * 1000, f"median_{prefix}_ms": percentile(data, 50)
            * 1000, f"std_{prefix}_ms": std(data) * 1000,
            f"p90_{prefix}_ms": percentile(data, 90) * 1000,
            f"p95_{prefix}_ms": percentile(data, 95) * 1000,
            f"p99_{prefix}_ms": percentile(data, 99) * 1000}


def calculate(prompt_lens: list[int], outputs: list[RequestOutput], dur_s: float) -> dict:
    """BenchmarkMetrics as a dict keyed like the result line."""
    output_lens: list[int] = []
    retok: list[int] = []
    total_input = completed = 0
    itls: list[float] = []
    tpots: list[float] = []
    ttfts: list[float] = []
    e2e: list[float] = []
    for prompt_len, out in zip(prompt_lens, outputs, strict=True):
        if not out.success:
            output_lens.append(0)
            retok.append(0)
            continue
        output_lens.append(out.output_len)
        retok.append(len(out.generated_text.split()))
        total_input += prompt_len
        if out.output_len > 1:
            tpots.append((out.latency - out.ttft) / (out.output_len - 1))
        itls += out.itl
        ttfts.append(out.ttft)
        e2e.append(out.latency)
        completed += 1
    peak_tokens, peak_concurrent = _peaks(outputs)
    total_output = sum(output_lens)
    m = {
        "completed": completed, "total_input_tokens": total_input,
        "total_input_text_tokens": total_input, "total_input_vision_tokens": 0,
        "total_output_tokens": total_output, "total_output_tokens_retokenized": sum(retok),
        "request_throughput": completed / dur_s, "input_throughput": total_input / dur_s,
        "output_throughput": total_output / dur_s,
        "total_throughput": (total_input + total_output) / dur_s,
        **_stats("e2e_latency", e2e, or_zero=False),
        **_stats("ttft", ttfts, or_zero=True),
        **_stats("tpot", tpots, or_zero=True),
        **_stats("itl", itls, or_zero=True),
        "max_itl_ms": max(itls or [0.0]) * 1000,
        "concurrency": sum(e2e) / dur_s,
        "max_output_tokens_per_s": peak_tokens, "max_concurrent_requests": peak_concurrent,
        "_output_lens": output_lens,
    }
    return m


def _peaks(outputs: list[RequestOutput]) -> tuple[float, int]:
    """Peak output tokens in a one-second bucket and peak requests in flight per second."""
    ok = [o for o in outputs if o.success]
    if not ok:
        return 0.0, 0
    t0 = min(o.start_time for o in ok)
    t1 = max(o.start_time + o.latency for o in ok)
    n = int(math.ceil(t1 - t0)) + 1
    tokens = [0] * n
    concurrent = [0] * n
    for o in ok:
        t = o.start_time + o.ttft
        times = [t]
        for gap in o.itl:
            t += gap
            times.append(t)
        for tt in times:
            b = int(tt - t0)
            if 0 <= b < n:
                tokens[b] += 1
        first = int(o.start_time - t0)
        last = int(o.start_time + o.latency - t0)
        for sec in range(first, min(last + 1, n)):
            concurrent[sec] += 1
    return float(max(tokens)), int(max(concurrent))


def goodput(outputs: list[RequestOutput], slos: dict[str, float], dur_s: float) -> dict:
    """sglang/benchmark/goodput.py::calculate_goodput, as the keys it adds."""
    good = 0
    met = dict.fromkeys(slos, 0)
    for o in outputs:
        if not o.success:
            continue
        tpot = (o.latency - o.ttft) / (o.output_len - 1) if o.output_len > 1 else 0.0
        seen = {"ttft": o.ttft * 1000, "tpot": tpot * 1000, "e2el": o.latency * 1000}
        ok = [k for k, slo in slos.items() if seen[k] <= slo]
        for k in ok:
            met[k] += 1
        good += len(ok) == len(slos)
    return {"goodput_slos_ms": slos, "request_goodput": good / dur_s,
            "slo_attainment": good / len(outputs),
            "slo_attainment_by_metric": {k: c / len(outputs) for k, c in met.items()}}


def _row(label: str, value, fmt: str = "") -> str:
    return ("{:<40} {:<10" + fmt + "}").format(label, value)


def report(backend: str, rate: float, max_concurrency: int | None, duration: float,
           m: dict, accept_length, gp: dict | None) -> str:
    """The block serving.py prints after a run (same labels, widths and order)."""
    lines = ["\n{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="),
             _row("Backend:", backend), _row("Traffic request rate:", rate),
             _row("Max request concurrency:", max_concurrency if max_concurrency
                  else "not set"),
             _row("Successful requests:", m["completed"]),
             _row("Benchmark duration (s):", duration, ".2f"),
             _row("Total input tokens:", m["total_input_tokens"]),
             _row("Total input text tokens:", m["total_input_text_tokens"]),
             _row("Total generated tokens:", m["total_output_tokens"]),
             _row("Total generated tokens (retokenized):",
                  m["total_output_tokens_retokenized"]),
             _row("Request throughput (req/s):", m["request_throughput"], ".2f"),
             _row("Input token throughput (tok/s):", m["input_throughput"], ".2f"),
             _row("Output token throughput (tok/s):", m["output_throughput"], ".2f"),
             _row("Peak output token throughput (tok/s):", m["max_output_tokens_per_s"],
                  ".2f"),
             _row("Peak concurrent requests:", m["max_concurrent_requests"]),
             _row("Total token throughput (tok/s):", m["total_throughput"], ".2f"),
             _row("Concurrency:", m["concurrency"], ".2f")]
    if accept_length:
        lines.append(_row("Accept length:", accept_length, ".2f"))
    if gp:
        slos = " ".join(f"{k}:{v:g}" for k, v in gp["goodput_slos_ms"].items())
        lines += ["{s:{c}^{n}}".format(s="Goodput", n=50, c="-"), _row("SLOs (ms):", slos),
                  _row("Request goodput (req/s):", gp["request_goodput"], ".2f"),
                  _row("SLO attainment (%):", gp["slo_attainment"] * 100, ".2f")]
        lines += [_row(f"{k.upper()} SLO attainment (%):", v * 100, ".2f")
                  for k, v in gp["slo_attainment_by_metric"].items()]
    sections = [("End-to-End Latency", "E2E Latency", "e2e_latency", ("Mean", "Median", "P90",
                                                                    "P95", "P99")),
                ("Time to First Token", "TTFT", "ttft", ("Mean", "Median", "P90", "P95",
                                                         "P99")),
                ("Time per Output Token (excl. 1st token)", "TPOT", "tpot",
                 ("Mean", "Median", "P90", "P95", "P99")),
                ("Inter-Token Latency", "ITL", "itl", ("Mean", "Median", "P90", "P95", "P99",
                                                       "Max"))]
    for title, label, key, stats in sections:
        lines.append("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        for stat in stats:
            lines.append(_row(f"{stat} {label} (ms):", m[f"{stat.lower()}_{key}_ms"], ".2f"))
    lines.append("=" * 50)
    return "\n".join(lines)
