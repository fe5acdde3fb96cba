"""Judging a switched host by live traffic: its error rate and TTFT/ITL p99 over a
window against the hosts not switched yet, from their own metrics.

Why: a benchmark right after a switch is one load at one moment; the gateway's real
traffic shows a slower profile (Flagger's and Argo Rollouts' canary analysis for web
services). Pure: windows in (gpuserve/monitor/live.py), a verdict out; the rolling
switch (roles/router/rolling.py) reads the hosts and acts on it.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from enum import StrEnum

from gpuserve.errors import InputError
from gpuserve.monitor.live import Snapshot, Window, pooled, quantile, window
from gpuserve.parsers.common import ParseError
from gpuserve.parsers.prometheus_text import parse_metrics
from gpuserve.paths import SCRIPTS_DIR
from gpuserve.settings import settings as merged

LIVE_DEFAULTS = {
    # A rolling switch watches each switched host under live traffic for this many
    # seconds after its benchmark passes, against the hosts not switched yet; 0: off
    # accepts: int (0..86400)
    "rolling_live_window": 300,
    # fewest requests each side needs in the window for a verdict (fewer: it waits)
    # accepts: int (1..1000000)
    "rolling_live_min_requests": 50,
    # most seconds it waits beyond the window for those requests; then the host goes
    # on unjudged, saying so
    # accepts: int (0..86400)
    "rolling_live_max_wait": 600,
    # a p99 (TTFT or ITL) more than this ratio of the old hosts' is a regression
    # accepts: float (> 1)
    "rolling_live_latency_ratio": 1.2,
    # an error rate more than this many points above the old hosts' is a regression
    # accepts: float (0..1)
    "rolling_live_error_rate_delta": 0.01,
}
#: seconds between reads while a window has too few requests (bounded by max_wait)
WAIT_STEP_S = 15
#: the host script that reads the workers' /metrics on the router host
READ_SCRIPT = SCRIPTS_DIR / "metrics_read.py"
#: latencies closer than this (seconds) are equal, whatever the ratio (bucket noise);
#: under the 5 ms width of SGLang's ITL buckets between 10 and 40 ms, so a p99 a whole
#: bucket up (15-20 to 20-25 ms: a 30 % slower decode at ~17 ms) counts when the ratio
#: holds too
LATENCY_FLOOR_S = 0.004


@dataclass(frozen=True)
class LiveSettings:
    window_s: int
    min_requests: int
    max_wait_s: int
    latency_ratio: float
    error_delta: float


class LiveKind(StrEnum):
    """What the live judgement found (a StrEnum: prints and compares as its word)."""

    PASS = "pass"
    REGRESSION = "regression"
    WAIT = "wait"  # not enough traffic yet
    UNJUDGED = "unjudged"  # nothing to compare against, or unreadable figures


@dataclass(frozen=True)
class Verdict:
    kind: LiveKind
    message: str
    metric: str | None = None


def _number(data: dict, key: str, source: str, low: float, high: float,
            kind: type = int) -> float:
    value = merged(data, LIVE_DEFAULTS)[key]
    ok_type = (int,) if kind is int else (int, float)
    if isinstance(value, bool) or not isinstance(value, ok_type) or not low <= value <= high:
        raise InputError(source, key, f"must be a number in [{low:g}, {high:g}], got "
                         f"{value!r:.40}")
    return value


def live_settings(data: dict, source: str) -> LiveSettings | None:
    """Host data over :data:`LIVE_DEFAULTS`; None when the window is 0 (off)."""
    window = _number(data, "rolling_live_window", source, 0, 86_400)
    settings = LiveSettings(
        int(window), int(_number(data, "rolling_live_min_requests", source, 1, 1_000_000)),
        int(_number(data, "rolling_live_max_wait", source, 0, 86_400)),
        float(_number(data, "rolling_live_latency_ratio", source, 1.0, 100.0, float)),
        float(_number(data, "rolling_live_error_rate_delta", source, 0.0, 1.0, float)))
    if settings.latency_ratio <= 1.0:
        raise InputError(source, "rolling_live_latency_ratio", "must be above 1")
    return settings if window else None


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def judge(host: str, switched: Window, old: list[Window], settings: LiveSettings,
          waited_s: float = 0.0) -> Verdict:
    """The switched host against the pooled hosts not switched yet."""
    if not old:
        return Verdict(LiveKind.UNJUDGED, f"{host}: no host on the previous profile left to "
                       "compare with: not judged by live traffic")
    base = pooled(old)
    short = [f"{name} served {n:.0f} requests" for name, n in (
        (host, switched.requests), ("the not-yet-switched hosts", base.requests))
        if n < settings.min_requests]
    if short:
        text = f"{'; '.join(short)} in {switched.seconds:.0f} s (minimum " \
               f"{settings.min_requests})"
        if waited_s >= settings.max_wait_s:
            return Verdict(LiveKind.UNJUDGED, f"{host}: {text}, after waiting {waited_s:.0f} s: "
                           "too little traffic to judge; going on")
        return Verdict(LiveKind.WAIT, f"{host}: {text}: waiting for more traffic")
    if switched.error_rate - base.error_rate > settings.error_delta:
        return Verdict(LiveKind.REGRESSION, f"{host}: error rate {switched.error_rate:.1%} "
                       f"({switched.aborted:.0f} of {switched.requests:.0f} aborted) against "
                       f"{base.error_rate:.1%} on the not-yet-switched hosts (limit "
                       f"+{settings.error_delta:.1%})", "error_rate")
    for metric, mine, theirs in (("TTFT p99", quantile(0.99, switched.ttft),
                                  quantile(0.99, base.ttft)),
                                 ("ITL p99", quantile(0.99, switched.itl),
                                  quantile(0.99, base.itl))):
        if mine is None or theirs is None:
            continue
        if mine > theirs * settings.latency_ratio and mine - theirs > LATENCY_FLOOR_S:
            return Verdict(LiveKind.REGRESSION, f"{host}: {metric} {_ms(mine)} against "
                           f"{_ms(theirs)} on the not-yet-switched hosts "
                           f"(x{mine / theirs:.2f}, limit x{settings.latency_ratio:g})",
                           metric)
    return Verdict(LiveKind.PASS, f"{host}: live traffic as good as the not-yet-switched hosts "
                   f"over {switched.seconds:.0f} s ({switched.requests:.0f} requests, "
                   f"{switched.tok_s:.0f} tok/s)")


def read_command(urls: tuple[str, ...]) -> str:
    """Shell that reads every URL's ``/metrics`` on the router host (metrics_read.py,
    passed inline with ``python3 -c``: nothing to install first)."""
    return " ".join(shlex.quote(a) for a in ("python3", "-c", READ_SCRIPT.read_text(), *urls))


@dataclass(frozen=True)
class Reads:
    """One read of several workers at ``at``: a snapshot per URL, or why there is none."""

    at: float
    snapshots: dict[str, Snapshot] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def parse_reads(text: str, urls: tuple[str, ...], at: float) -> Reads:
    """metrics_read.py's JSON line; a URL it did not answer for, or whose text does not
    parse, gets an error (bounded), never an exception."""
    snapshots: dict[str, Snapshot] = {}
    errors: dict[str, str] = {}
    try:
        doc = json.loads((text or "").strip().splitlines()[-1])
        answers = {r["url"]: r for r in doc["reads"] if isinstance(r, dict)}
    except (ValueError, IndexError, KeyError, TypeError):
        return Reads(at, {}, {u: f"the read printed {(text or '')[-200:]!r}" for u in urls})
    for url in urls:
        answer = answers.get(url)
        if answer is None or not isinstance(answer.get("text"), str):
            errors[url] = str((answer or {}).get("error") or "no answer")[:300]
            continue
        try:
            snapshots[url] = Snapshot(at, tuple(parse_metrics(answer["text"])))
        except ParseError as exc:
            errors[url] = f"/metrics of {url}: {exc}"[:300]
    return Reads(at, snapshots, errors)


def compare(host: str, url: str, old_urls: tuple[str, ...], first: Reads, last: Reads,
            settings: LiveSettings, waited_s: float) -> tuple[Verdict, list[str]]:
    """The verdict between two reads, and notes on hosts left out of the comparison. A
    switched host whose /metrics cannot be read is not judged (a judgement that cannot
    be made rolls nothing back); an old host that cannot be read is left out."""
    mine = [r.errors.get(url) for r in (first, last) if url not in r.snapshots]
    if mine:
        return Verdict(LiveKind.UNJUDGED, f"{host}: its /metrics could not be read ({mine[0]}): "
                       "not judged by live traffic"), []
    notes, old = [], []
    for other in old_urls:
        missing = [r.errors.get(other) for r in (first, last) if other not in r.snapshots]
        if missing:
            notes.append(f"{other} left out of the comparison: {missing[0]}")
        else:
            old.append(window(first.snapshots[other], last.snapshots[other]))
    switched = window(first.snapshots[url], last.snapshots[url])
    return judge(host, switched, old, settings, waited_s), notes


def next_read_in(settings: LiveSettings, waited_s: float) -> float:
    """Seconds until the next read while waiting for traffic (at least 1)."""
    return max(1.0, min(float(WAIT_STEP_S), settings.max_wait_s - waited_s))
