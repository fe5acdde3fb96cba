"""The SGLang stand-in's latency histograms: SGLang's default bucket bounds
(python/sglang/srt/metrics/collector.py of sgl-project/sglang at
00ae9c1590d2d0bb6c0bfff39e312c34ae3dd538), and what the live judge of a rolling switch
sees through them with the lab fleet's settings (inventory/lab_fleet.py): the fleet's
surface (lab/surfaces/fleet.yaml, bundled in the wheel) makes the slower profile's launch
(tests/fixtures/profiles/lab-slower-decode.yaml) decode 30 % slower, a regression, and
the two shipped profiles a rolling switch moves between equal.

The stand-in's ``render_metrics`` runs in a subprocess from the built wheel (conftest's
``site23``), as the other stand-in tests run it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from gpuserve.monitor.live import ITL, TTFT, Snapshot, quantile, window
from gpuserve.monitor.live_judge import judge, live_settings
from gpuserve.parsers.prometheus_text import parse_metrics

REPO = Path(__file__).resolve().parents[3]
# the defaults in collector.py (TokenizerMetricsCollector.__init__), as SGLang prints them
SGLANG_TTFT = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
SGLANG_ITL = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040,
              0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0]
SGLANG_E2E = SGLANG_TTFT + [600, 1200, 1800, 2400]

# One stand-in per decode speed (a number), or per launch on the wheel's fleet surface (a
# mapping of server-args dests: the speed the server would run at), serving ``n``
# one-at-a-time requests of 10 tokens with a ~0.29 s TTFT (the lab fleet's fixed 0.294 s
# and its 5-token prompt at 8,000 tokens/s); prints /metrics' text.
_RENDER = """
import json, sys
from types import SimpleNamespace
from sglang._standin import surface
from sglang._standin.main import _load_surface
from sglang._standin.server import State, render_metrics
from sglang._standin.sim import ModelShape
fleet = _load_surface("fleet")
out = {}
for name, speed in json.loads(sys.argv[1]).items():
    flags = {"bucket_inter_token_latency": [0.01, 0.05]} if name == "flagged" else {}
    perf = None
    if isinstance(speed, dict):
        perf = fleet.start(surface.LaunchArgs(speed), ModelShape()).perf
        assert perf.ttft_s == 0.294 and perf.prefill_tps == 8000.0, perf
    state = State(SimpleNamespace(served_model_name="m", model_path="m", **flags), {}, "0",
                  decode_tps=speed if perf is None else 0.0, prefill_tps=8000.0, perf=perf)
    for _ in range(40):
        state.ttft.observe(0.294 + 5 / 8000.0)
        for _ in range(9):
            state.itl.observe(state.token_interval())
        state.e2e.observe(0.294 + 5 / 8000.0 + 9 * state.token_interval())
        state.requests_total += 1
        state.generation_tokens_total += 10
    out[name] = render_metrics(state)
print(json.dumps(out))
"""


def _launch(profile: str) -> dict:
    """The server args (dest names) the stand-in's parser holds for ``profile``."""
    from gpuserve.launch import catalog
    from gpuserve.launch.dialect import render_launch
    from gpuserve.launch.profiles import load_profile

    args = render_launch(load_profile(profile), "0.5.23").args
    return {k: v for k, v in vars(catalog.load_catalog("0.5.23").parse(args)).items()
            if v is not None}


def _render(site: Path, speeds: dict[str, float | dict]) -> dict[str, Snapshot]:
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-c", _RENDER, json.dumps(speeds)], env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    return {name: Snapshot(20.0, tuple(parse_metrics(text)))
            for name, text in json.loads(done.stdout).items()}


def test_the_histograms_have_sglangs_default_bounds_and_names(site23) -> None:
    snaps = _render(site23, {"a": 60.0, "flagged": 60.0})
    snap = snaps["a"]
    for name, bounds in ((TTFT, SGLANG_TTFT), (ITL, SGLANG_ITL),
                         ("sglang:e2e_request_latency_seconds_bucket", SGLANG_E2E)):
        assert sorted(snap.buckets(name)) == [float(b) for b in bounds] + [math.inf], name
    # 1/60 s per token: every one of the 360 intervals in the 15-20 ms bucket
    itl = snap.buckets(ITL)
    assert (itl[0.015], itl[0.02], itl[math.inf]) == (0.0, 360.0, 360.0)
    assert snap.buckets(TTFT)[0.2] == 0.0 and snap.buckets(TTFT)[0.4] == 40.0
    # --bucket-inter-token-latency 0.01 0.05 replaces the ITL default only
    assert snaps["flagged"].buckets(ITL) == {0.01: 0.0, 0.05: 360.0, math.inf: 360.0}
    assert sorted(snaps["flagged"].buckets(TTFT))[:-1] == [float(b) for b in SGLANG_TTFT]


def test_the_live_judge_sees_a_30_percent_slower_decode_and_passes_an_equal_one(
        site23) -> None:
    # a rolling switch in the lab fleet: from glm5-nvfp4-tp8 to glm5-nvfp4-tp8-eagle3
    # (equal), then to the slower profile (--disable-decode-cuda-graph: 60 / 1.3 tok/s)
    snaps = _render(site23, {"old": _launch("glm5-nvfp4-tp8"),
                             "same": _launch("glm5-nvfp4-tp8-eagle3"),
                             "slower": _launch(str(REPO / "tests/fixtures/profiles/"
                                                   "lab-slower-decode.yaml"))})
    zero = Snapshot(0.0, ())
    old, same, slower = (window(zero, snaps[k]) for k in ("old", "same", "slower"))
    # the lab fleet's window and minimum (inventory/lab_fleet.py); ratio and floor: defaults
    settings = live_settings({"rolling_live_window": 20, "rolling_live_min_requests": 10},
                             "host data")
    assert quantile(0.99, slower.itl) / quantile(0.99, old.itl) > settings.latency_ratio
    verdict = judge("lab-gpu", slower, [old], settings)
    assert (verdict.kind, verdict.metric) == ("regression", "ITL p99"), verdict.message
    assert "ITL p99 25 ms against 20 ms" in verdict.message
    verdict = judge("lab-gpu", same, [old], settings)
    assert verdict.kind == "pass", verdict.message
