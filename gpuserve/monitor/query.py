"""Live figures per host from the monitor host's Prometheus (its HTTP API's instant
query of the recording rules), for ``gpuserve fleet status``.

Why the monitor and not the hosts: "TTFT p99 over the last minutes" needs samples over
minutes, which Prometheus already holds (gpuserve:* rules, gpuserve/data/monitor/
rules.yaml); the controller asks one address, with one timeout, and no host at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpuserve import safeload
from gpuserve.errors import InputError

#: column -> the recording rule it reads (one instant query each)
LIVE_QUERIES = {
    "tok_s": "gpuserve:gen_tokens_per_second:rate1m",
    "running": "gpuserve:running_reqs",
    "queued": "gpuserve:queue_reqs",
    "kv_usage": "gpuserve:kv_usage:max",
    "ttft_p50_s": "gpuserve:ttft_seconds:p50_5m",
    "ttft_p99_s": "gpuserve:ttft_seconds:p99_5m",
    # PD disaggregation: requests in the role's PD queues, KV transfer p99 (prefill
    # hosts, where SGLang observes it), bootstrap and transfer failures over 5 minutes
    "pd_queue": "gpuserve:pd_queue_reqs",
    "kv_transfer_p99_ms": "gpuserve:kv_transfer_ms:p99_5m",
    "pd_bootstrap_failed": "gpuserve:pd_bootstrap_failed:increase5m",
    "pd_transfer_failed": "gpuserve:pd_transfer_failed:increase5m",
}
#: the PD columns: shown on a line of their own under the table, for PD hosts
PD_COLUMNS = ("pd_queue", "kv_transfer_p99_ms", "pd_bootstrap_failed", "pd_transfer_failed")
MAX_ANSWER = 4 * 1024 * 1024


@dataclass
class LiveFigures:
    """One host's figures (None: Prometheus has no value for it)."""

    values: dict[str, float | None] = field(default_factory=dict)

    def get(self, key: str) -> float | None:
        return self.values.get(key)


def query_path(rule: str) -> str:
    from urllib.parse import quote

    return f"/api/v1/query?query={quote(rule, safe='')}"


def parse_vector(text: str, source: str) -> dict[str, list[float]]:
    """An instant query's answer as host -> value (the ``host`` label the targets
    carry; series without one are left out; NaN, for no traffic, is no value)."""
    doc = safeload.loads_json(text, source)
    if not isinstance(doc, dict) or doc.get("status") != "success":
        error = doc.get("error") if isinstance(doc, dict) else None
        raise InputError(source, "status", f"not a successful Prometheus answer"
                         f"{': ' + str(error)[:200] if error else ''}")
    data = doc.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector" or \
            not isinstance(data.get("result"), list):
        raise InputError(source, "data", "not an instant vector")
    out: dict[str, list[float]] = {}
    for index, item in enumerate(data["result"]):
        metric = item.get("metric") if isinstance(item, dict) else None
        value = item.get("value") if isinstance(item, dict) else None
        if not isinstance(metric, dict) or not isinstance(value, list) or len(value) != 2:
            raise InputError(source, f"data.result[{index}]", "not a sample")
        host = metric.get("host")
        try:
            number = float(value[1])
        except (TypeError, ValueError):
            raise InputError(source, f"data.result[{index}].value", "not a number") from None
        if isinstance(host, str) and math.isfinite(number):
            out.setdefault(host, []).append(number)
    return out


#: columns whose series of one host add up (a host serving two profiles); the rest: max
SUMMED = ("tok_s", "running", "queued", "pd_queue", "pd_bootstrap_failed",
          "pd_transfer_failed")


def live_by_host(answers: dict[str, dict[str, list[float]]]) -> dict[str, LiveFigures]:
    """column -> (host -> values) turned into host -> figures."""
    hosts = {h for values in answers.values() for h in values}

    def one(col: str, host: str) -> float | None:
        values = answers.get(col, {}).get(host)
        if not values:
            return None
        return sum(values) if col in SUMMED else max(values)

    return {h: LiveFigures({col: one(col, h) for col in LIVE_QUERIES}) for h in hosts}
