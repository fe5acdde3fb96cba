"""Reading a host's /metrics: the text format (SGLang's published example output),
window figures from two reads, Prometheus's histogram_quantile, and the live judge of
a rolling switch."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gpuserve.errors import InputError
from gpuserve.monitor.live import Snapshot, Window, now, quantile, window
from gpuserve.monitor.live_judge import judge, live_settings
from gpuserve.parsers.common import ParseError
from gpuserve.parsers.prometheus_text import parse_metrics

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "metrics" / \
    "sglang-production-metrics.txt"
MODEL = (("model_name", "meta-llama/Llama-3.1-8B-Instruct"),)


def test_sglangs_published_output_parses() -> None:
    samples = parse_metrics(FIXTURE.read_text())
    by = {(s.name, s.labels): s.value for s in samples}
    assert by[("sglang:generation_tokens_total", MODEL)] == 7.557572e06
    assert by[("sglang:num_queue_reqs", MODEL)] == 2826.0
    assert by[("sglang:time_to_first_token_seconds_bucket",
               (("le", "+Inf"), *MODEL))] == 11008.0
    snap = Snapshot(0.0, tuple(samples))
    figures = now(snap)
    assert (figures.running, figures.queued, figures.kv_usage) == (162.0, 2826.0, 0.28)
    assert snap.buckets("sglang:time_to_first_token_seconds_bucket")[math.inf] == 11008.0


@pytest.mark.parametrize("text", [
    "sglang:x{le=\"0.5\" 3\n",  # unclosed labels
    "sglang:x 3 4 5\n",  # too many fields
    "sglang:x{a=\"b\"} three\n",
    "9bad 1\n",
])
def test_bad_lines_are_named(text: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_metrics("# HELP ok\n" + text)
    assert info.value.line_no == 2


def test_escapes_special_values_and_timestamps() -> None:
    (a, b) = parse_metrics('m{path="a\\"b\\\\c",x="1",} NaN\nm +Inf 1700000000000\n')
    assert a.labels == (("path", 'a"b\\c'), ("x", "1")) and math.isnan(a.value)
    assert b.value == math.inf


def _snap(at: float, requests: float, aborted: float, tokens: float,
          ttft: dict[str, float], itl: dict[str, float]) -> Snapshot:
    lines = [f'sglang:num_requests_total{{model_name="m"}} {requests}',
             f'sglang:num_aborted_requests_total{{model_name="m"}} {aborted}',
             f'sglang:generation_tokens_total{{model_name="m"}} {tokens}']
    lines += [f'sglang:time_to_first_token_seconds_bucket{{le="{le}",model_name="m"}} {n}'
              for le, n in ttft.items()]
    lines += [f'sglang:inter_token_latency_seconds_bucket{{le="{le}",model_name="m"}} {n}'
              for le, n in itl.items()]
    return Snapshot(at, tuple(parse_metrics("\n".join(lines))))


def test_window_counts_increases_and_survives_a_restart() -> None:
    before = _snap(0, 100, 1, 5000, {"0.5": 50, "+Inf": 100}, {"0.05": 10, "+Inf": 10})
    after = _snap(60, 300, 3, 17000, {"0.5": 150, "+Inf": 300}, {"0.05": 30, "+Inf": 30})
    w = window(before, after)
    assert (w.requests, w.aborted, w.tok_s) == (200, 2, 200.0)
    assert w.ttft == {0.5: 100, math.inf: 200}
    restarted = window(after, _snap(120, 40, 0, 1000, {"0.5": 40, "+Inf": 40}, {}))
    assert restarted.requests == 40  # counted from zero after the restart


def test_quantile_is_prometheus_histogram_quantile() -> None:
    # the same buckets the promtool test of TTFTAboveSLO evaluates to 1.99 s
    assert quantile(0.99, {0.5: 0, 1.0: 0, 2.0: 10, math.inf: 10}) == pytest.approx(1.99)
    assert quantile(0.5, {0.1: 50, 0.2: 100, math.inf: 100}) == pytest.approx(0.1)
    assert quantile(0.99, {0.1: 0, math.inf: 10}) == 0.1  # in +Inf: the highest bound
    assert quantile(0.99, {0.1: 0, math.inf: 0}) is None


def _w(requests=200, aborted=0, ttft_slow=0.0, itl_scale=1.0) -> Window:
    """A minute of traffic: TTFT between 0.1 and 0.2 s (plus ``ttft_slow`` of the
    requests at 0.4-0.8 s), ITL spread on 10-40 ms buckets scaled by ``itl_scale``."""
    slow = requests * ttft_slow
    ttft = {0.1: 0, 0.2: requests - slow, 0.4: requests - slow, 0.8: requests,
            math.inf: requests}
    bounds = [0.01, 0.02, 0.04, 0.08]
    itl = {b * itl_scale: 1000 * (i + 1) / len(bounds) for i, b in enumerate(bounds)}
    itl[math.inf] = 1000
    return Window(60.0, requests, aborted, requests * 100.0, ttft, itl)


SETTINGS = live_settings({}, "inv.py")


def test_equal_traffic_passes() -> None:
    verdict = judge("gpu1", _w(), [_w(), _w()], SETTINGS)
    assert verdict.kind == "pass", verdict.message


def test_thirty_percent_slower_itl_is_a_regression_naming_metric_and_numbers() -> None:
    verdict = judge("gpu1", _w(itl_scale=1.3), [_w(), _w()], SETTINGS)
    assert (verdict.kind, verdict.metric) == ("regression", "ITL p99")
    assert "x1.30" in verdict.message and "limit x1.2" in verdict.message


def test_slower_ttft_and_errors_are_regressions() -> None:
    assert judge("gpu1", _w(ttft_slow=0.05), [_w()], SETTINGS).metric == "TTFT p99"
    verdict = judge("gpu1", _w(aborted=10), [_w(aborted=1)], SETTINGS)
    assert verdict.metric == "error_rate" and "10 of 200 aborted" in verdict.message


def test_too_little_traffic_waits_then_goes_on_unjudged() -> None:
    assert judge("gpu1", _w(requests=10), [_w()], SETTINGS).kind == "wait"
    late = judge("gpu1", _w(requests=10), [_w()], SETTINGS, waited_s=600)
    assert late.kind == "unjudged" and "too little traffic" in late.message
    assert judge("gpu1", _w(), [], SETTINGS).kind == "unjudged"


def test_settings_from_host_data() -> None:
    assert live_settings({"rolling_live_window": 0}, "inv.py") is None
    assert SETTINGS is not None and SETTINGS.window_s == 300
    for key, value in (("rolling_live_window", -1), ("rolling_live_latency_ratio", 1.0),
                       ("rolling_live_min_requests", "50"),
                       ("rolling_live_error_rate_delta", 2)):
        with pytest.raises(InputError) as info:
            live_settings({key: value}, "inv.py")
        assert info.value.field == key
