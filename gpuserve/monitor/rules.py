"""Prometheus recording and alert rules (gpuserve/data/monitor/rules.yaml) and the
per-host thresholds they compare with, generated from the inventory.

Why thresholds as series: a profile's TTFT SLO, a host's last benchmark and its GPU
count differ per host, so they become recording rules of constant value labelled with
the host (``gpuserve:ttft_slo_seconds{host="gpu1"} 0.8``) and the alerts stay one text
for every fleet, testable once with ``promtool test rules``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from gpuserve import safeload
from gpuserve.errors import InputError
from gpuserve.paths import DATA_DIR

RULES_PATH = DATA_DIR / "monitor" / "rules.yaml"
#: the longest ``for:`` host data may ask for (a day); longer is a typo
MAX_FOR = 86_400
RECORDING_FILE = "recording.yml"
ALERTS_FILE = "alerts.yml"
THRESHOLDS_FILE = "thresholds.yml"


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_s: int
    severity: str
    summary: str
    runbook: str


@dataclass(frozen=True)
class HostThresholds:
    """What one host's alerts compare with (None: that alert stays quiet for it)."""

    host: str
    ttft_slo_s: float | None = None  # the profile's bench.expect p99_ttft_ms, in seconds
    bench_tok_s: float | None = None  # the last benchmark's output_throughput
    bench_concurrency: float | None = None  # ... and its max_concurrency
    gpus: int | None = None  # GPUs of its last recorded run


@cache
def load_rules(path: Path = RULES_PATH) -> tuple[tuple[dict, ...], tuple[Alert, ...]]:
    """The recording rules and alerts of the data file, checked by name."""
    doc = safeload.load_yaml_file(path)
    if not isinstance(doc, dict):
        raise InputError(path, None, "must be a mapping with recording and alerts")
    recording = doc.get("recording") or []
    alerts = []
    for index, raw in enumerate(doc.get("alerts") or []):
        where = f"alerts[{index}]"
        missing = {"alert", "expr", "for", "severity", "summary", "runbook"} - set(raw)
        if missing:
            raise InputError(path, where, f"missing {', '.join(sorted(missing))}")
        alerts.append(Alert(raw["alert"], " ".join(str(raw["expr"]).split()),
                            int(raw["for"]), raw["severity"], raw["summary"],
                            raw["runbook"]))
    return tuple(recording), tuple(alerts)


def alert_names() -> list[str]:
    return [a.name for a in load_rules()[1]]


def check_for_overrides(value: object, source: str) -> dict[str, int]:
    """Host data ``monitor_alert_for``: {alert name: seconds}, names the rules have."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(source, "monitor_alert_for", "must be a mapping of alert name to "
                         "seconds")
    names = alert_names()
    out = {}
    for name, seconds in value.items():
        if name not in names:
            raise InputError(source, f"monitor_alert_for.{name}",
                             f"no such alert (alerts: {', '.join(names)})")
        if isinstance(seconds, bool) or not isinstance(seconds, int) or not \
                0 <= seconds <= MAX_FOR:
            raise InputError(source, f"monitor_alert_for.{name}",
                             f"must be whole seconds in [0, {MAX_FOR}], got {seconds!r:.40}")
        out[name] = seconds
    return out


def _duration(seconds: int) -> str:
    return f"{seconds}s"


def recording_text(interval_s: int) -> str:
    recording, _ = load_rules()
    return _dump({"groups": [{"name": "gpuserve-recording", "interval": _duration(interval_s),
                              "rules": [dict(r) for r in recording]}]})


def alerts_text(for_overrides: dict[str, int], interval_s: int) -> str:
    """The alert group, each ``for:`` from the data file unless host data overrides it."""
    rules = []
    for alert in load_rules()[1]:
        rules.append({
            "alert": alert.name, "expr": alert.expr,
            "for": _duration(for_overrides.get(alert.name, alert.for_s)),
            "labels": {"severity": alert.severity},
            "annotations": {"summary": alert.summary, "runbook": alert.runbook},
        })
    return _dump({"groups": [{"name": "gpuserve-alerts", "interval": _duration(interval_s),
                              "rules": rules}]})


def thresholds_text(hosts: list[HostThresholds], interval_s: int) -> str:
    """One constant series per known threshold and host."""
    rules = []
    for h in sorted(hosts, key=lambda t: t.host):
        for record, value in (("gpuserve:ttft_slo_seconds", h.ttft_slo_s),
                              ("gpuserve:bench_output_tok_s", h.bench_tok_s),
                              ("gpuserve:bench_concurrency", h.bench_concurrency),
                              ("gpuserve:expected_gpus", h.gpus)):
            if value is not None:
                rules.append({"record": record, "expr": f"vector({float(value)!r})",
                              "labels": {"host": h.host}})
    return _dump({"groups": [{"name": "gpuserve-thresholds", "interval": _duration(interval_s),
                              "rules": rules}]})


def _dump(doc: dict) -> str:
    return "# generated by gpuserve (gpuserve/monitor); do not edit on the host\n" + \
        yaml.safe_dump(doc, sort_keys=False, width=100)
