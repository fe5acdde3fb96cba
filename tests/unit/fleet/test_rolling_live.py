"""A rolling switch judged by live traffic (roles/router/live.py): the workers' /metrics
read on the router host by metrics_read.py (run for real against a loopback server with
SGLang's published output), the watch's reads and waits, and the operation's sequence on
a regression (take out, restore the last good configuration, fail the host) through
pyinfra's real execution path with the @fake connector."""

from __future__ import annotations

import contextlib
import http.server
import json
import logging
import subprocess
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_rolling_serial import fleet_inventory, plan_in, rollout

import gpuserve.roles.checks.probe
import gpuserve.roles.router.live as live
from gpuserve.measure.health import Probe
from gpuserve.monitor.live_judge import (
    Verdict,
    compare,
    live_settings,
    parse_reads,
    read_command,
)
from gpuserve.roles.router.rolling import Switching
from gpuserve.roles.service.rollback import RollbackSpec
from tests.unit.conftest import run_fake_op

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "metrics" / \
    "sglang-production-metrics.txt"
ME, OLD = "http://a:30000", "http://b:30000"
SETTINGS = live_settings({"rolling_live_window": 20, "rolling_live_min_requests": 10,
                          "rolling_live_max_wait": 60}, "inv.py")


@contextlib.contextmanager
def metrics_server(body: bytes):
    """SGLang's /metrics on a loopback port."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            status = 200 if self.path == "/metrics" else 404
            self.send_response(status)
            self.send_header("Content-Length", str(len(body) if status == 200 else 0))
            self.end_headers()
            if status == 200:
                self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_read_on_the_router_host_keeps_the_judged_series_of_sglangs_output() -> None:
    with metrics_server(FIXTURE.read_bytes()) as url:
        urls = (url, "http://127.0.0.1:9/", "file:///etc/passwd")
        out = subprocess.run(["sh", "-c", read_command(urls)], capture_output=True,
                             text=True, timeout=60, check=True).stdout
    reads = parse_reads(out, urls, at=5.0)
    snap = reads.snapshots[url]
    assert snap.at == 5.0
    assert snap.total("sglang:generation_tokens_total") == 7.557572e06
    assert snap.buckets("sglang:time_to_first_token_seconds_bucket")[float("inf")] == 11008.0
    # only the series the judgement reads travel back
    assert {s.name for s in snap.samples} <= {
        "sglang:num_requests_total", "sglang:num_aborted_requests_total",
        "sglang:generation_tokens_total", "sglang:time_to_first_token_seconds_bucket",
        "sglang:inter_token_latency_seconds_bucket"}
    assert reads.errors["http://127.0.0.1:9/"].startswith("GET http://127.0.0.1:9/metrics: ")
    assert "Connection refused" in reads.errors["http://127.0.0.1:9/"]
    assert reads.errors["file:///etc/passwd"] == "not an http(s) URL"


def test_garbage_from_the_read_is_an_error_per_url_never_an_exception() -> None:
    reads = parse_reads("Traceback (most recent call last):", (ME, OLD), 0.0)
    assert reads.snapshots == {} and "Traceback" in reads.errors[ME]
    bad = json.dumps({"reads": [{"url": ME, "text": "sglang:x{le= 1\n", "error": None}]})
    reads = parse_reads(bad, (ME, OLD), 0.0)
    assert ME in reads.errors and reads.errors[OLD] == "no answer"


def metrics(requests: int, itl_ms: float, aborted: int = 0) -> str:
    """A worker's judged series: ``requests`` requests, each with 10 tokens at
    ``itl_ms`` and a 50 ms first token."""
    lines = [f'sglang:num_requests_total{{model_name="m"}} {requests}',
             f'sglang:num_aborted_requests_total{{model_name="m"}} {aborted}',
             f'sglang:generation_tokens_total{{model_name="m"}} {requests * 10}']
    for le in (0.01, 0.025, 0.05, 0.1, "+Inf"):
        ttft = requests if le == "+Inf" or le >= 0.05 else 0
        lines.append(f'sglang:time_to_first_token_seconds_bucket{{le="{le}"}} {ttft}')
        itl = requests * 10 if le == "+Inf" or le * 1000 >= itl_ms else 0
        lines.append(f'sglang:inter_token_latency_seconds_bucket{{le="{le}"}} {itl}')
    return "\n".join(lines) + "\n"


def answer(**texts: str | None) -> str:
    urls = {"me": ME, "old": OLD}
    return json.dumps({"reads": [{"url": urls[k], "text": t, "error": None if t else "refused"}
                                 for k, t in texts.items()]})


def test_an_unreadable_switched_host_is_not_judged_and_an_unreadable_old_one_left_out() -> None:
    first = parse_reads(answer(me=None, old=metrics(0, 20)), (ME, OLD), 0)
    verdict, _ = compare("a", ME, (OLD,), first, first, SETTINGS, 0)
    assert verdict.kind == "unjudged" and "could not be read (refused)" in verdict.message
    first = parse_reads(answer(me=metrics(0, 20), old=None), (ME, OLD), 0)
    last = parse_reads(answer(me=metrics(40, 20), old=None), (ME, OLD), 30)
    verdict, notes = compare("a", ME, (OLD,), first, last, SETTINGS, 0)
    assert verdict.kind == "unjudged" and "no host on the previous profile" in verdict.message
    assert notes == [f"{OLD} left out of the comparison: refused"]


class Clock:
    """time for roles/router/live.py: sleeping moves it on."""

    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class Router:
    """The router host answering metrics_read.py with scripted reads, in order."""

    def __init__(self, answers: list[str]):
        self.answers, self.commands = answers, []

    def run_shell_command(self, command, **kwargs):
        self.commands.append(command)
        return True, SimpleNamespace(stdout_lines=[self.answers.pop(0)], stderr_lines=[])


def watch_with(monkeypatch, answers: list[str]) -> tuple[Verdict, Clock, Router]:
    clock, router = Clock(), Router(answers)
    monkeypatch.setattr(live, "time", clock)
    monkeypatch.setattr(live, "connected_router", lambda r: router)
    plan = rollout("a")
    plan = type(plan)(**{**plan.__dict__, "url": ME, "later": (OLD,)})
    return live.watch("a", plan, SETTINGS), clock, router


def test_too_few_requests_waits_then_a_slower_itl_is_a_regression(monkeypatch) -> None:
    verdict, clock, router = watch_with(monkeypatch, [
        answer(me=metrics(100, 20), old=metrics(500, 20)),
        answer(me=metrics(105, 28), old=metrics(560, 20)),  # 5 requests: too few
        answer(me=metrics(140, 28), old=metrics(600, 20)),
    ])
    assert clock.sleeps == [20, 15]  # the window, then one wait step
    assert (verdict.kind, verdict.metric) == ("regression", "ITL p99")
    # p99 within the buckets the counts fall in: 25-50 ms against 10-25 ms
    assert "ITL p99 50 ms against 25 ms on the not-yet-switched hosts" in verdict.message
    assert all(ME in c and OLD in c for c in router.commands)


def test_equal_traffic_passes_and_too_little_goes_on_unjudged(monkeypatch) -> None:
    verdict, _, _ = watch_with(monkeypatch, [answer(me=metrics(0, 20), old=metrics(0, 20)),
                                             answer(me=metrics(30, 20), old=metrics(30, 20))])
    assert verdict.kind == "pass", verdict.message
    quiet = [answer(me=metrics(0, 20), old=metrics(0, 20))] * 6
    verdict, clock, _ = watch_with(monkeypatch, quiet)
    assert verdict.kind == "unjudged" and "too little traffic" in verdict.message
    assert sum(clock.sleeps) - 20 == 60  # waited rolling_live_max_wait, no more


def test_a_long_window_says_how_long_is_left(monkeypatch, caplog) -> None:
    clock = Clock()
    monkeypatch.setattr(live, "time", clock)
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        live._wait_window("a", 150)
    assert clock.sleeps == [60, 60, 30]
    assert "a: live: 90 s of the window left" in caplog.text
    assert "a: live: 30 s of the window left" in caplog.text


def test_the_last_worker_of_a_roll_is_not_watched(monkeypatch) -> None:
    clock = Clock()
    monkeypatch.setattr(live, "time", clock)
    verdict = live.watch("b", rollout("b"), SETTINGS)  # later: () (no host after it)
    assert verdict.kind == "unjudged" and clock.sleeps == []


def test_later_workers_follow_the_inventory_order() -> None:
    inv = fleet_inventory()
    assert plan_in(inv, "lab-gpu").later == ("http://10.77.0.2:30000",)
    assert plan_in(inv, "lab-gpu-2").later == ()


A, B = "a" * 40 + " 600:root:root", "b" * 40 + " 600:root:root"


def state_lines(live_: str, saved: str, profile: str) -> list[str]:
    """state_command's output for one file (the unit), live and saved."""
    return ["file live unit /live/unit", "file saved unit /saved/unit",
            f"{live_.split()[0]}  /live/unit", f"mode {live_.split()[1]} /live/unit",
            f"{saved.split()[0]}  /saved/unit", f"mode {saved.split()[1]} /saved/unit",
            f"profile {profile}"]


def run_judge(monkeypatch, verdict: Verdict, switching: Switching | None = None):
    """judge_live on a @fake host whose watch ends in ``verdict``; the order of what
    ran (the take-out, host commands) and the operation's meta."""
    events: list[str] = []
    monkeypatch.setattr(live, "watch", lambda *a: verdict)

    def take_out(host_, *args) -> bool:
        events.append("take-out")
        return True

    monkeypatch.setattr(live, "take_out_now", take_out)
    monkeypatch.setattr(gpuserve.roles.checks.probe, "parse_probe", lambda _out: Probe(
        200, "active", "running", 0, None, [], []))
    responses = {"sha1sum": state_lines(B, A, "good")}
    meta, commands = run_fake_op(
        live.judge_live, responses, rollout=rollout("a"),
        switching=switching or Switching(restarts=True, rollout=rollout("a")),
        settings=SETTINGS, bin_dir="/opt/gpuserve/bin", port=30000, config="/c",
        rollback=RollbackSpec(profile_name="slow"), health_timeout=60)
    for command in commands:
        events.append("restore" if "systemctl restart" in command else "read")
    return meta, events


def test_a_regression_takes_the_worker_out_rolls_it_back_and_stops_the_roll(
        monkeypatch, caplog) -> None:
    regression = Verdict("regression", "a: ITL p99 28 ms against 20 ms on the "
                         "not-yet-switched hosts (x1.40, limit x1.2)", "ITL p99")
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        meta, events = run_judge(monkeypatch, regression)
    assert not meta.did_succeed()
    assert events[0] == "take-out" and events.count("restore") == 1
    text = caplog.text
    assert "rolling switch: live traffic: a: ITL p99 28 ms against 20 ms" in text
    assert "profile slow is rolled back on" in text and "the rolling switch stops" in text
    assert "the host was rolled back to profile good, which is healthy again" in text


@pytest.mark.parametrize("kind", ["pass", "unjudged"])
def test_a_pass_or_no_verdict_goes_on_without_a_change(monkeypatch, caplog, kind) -> None:
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        meta, events = run_judge(monkeypatch, Verdict(kind, f"a: {kind} because"))
    assert meta.did_succeed() and not meta.did_change() and events == []
    assert f"a: {kind} because" in caplog.text


def test_no_watch_when_the_gateway_was_stopped(monkeypatch) -> None:
    stopped = Switching(restarts=True, rollout=rollout("a"), gateway_stopped=True)
    meta, events = run_judge(monkeypatch, Verdict("regression", "never"), stopped)
    assert meta.did_succeed() and events == []


def test_gpuserve_check_knows_the_live_keys_and_catches_their_typos() -> None:
    from gpuserve.commands.check import misspelt_keys
    from gpuserve.errors import InputError

    misspelt_keys({"rolling_live_window": 0, "rolling_live_max_wait": 60}, "inv.py")
    with pytest.raises(InputError) as info:
        misspelt_keys({"rolling_live_windows": 20}, "inv.py")
    assert "did you mean rolling_live_window" in info.value.message


def test_a_take_out_for_a_rollback_that_fails_says_the_regressed_profile_keeps_serving(
        monkeypatch) -> None:
    """The take-out judge_live yields: a gateway whose unit runs but does not answer
    stops it, and the report says the host was switched and not rolled back."""
    from test_rolling_take_out import RouterHost

    import gpuserve.roles.router.rolling as rolling

    seen: list[str] = []
    monkeypatch.setattr(rolling, "_fail", lambda host_, message, footer=(): seen.append(
        message) or False)
    monkeypatch.setattr(rolling, "connected_router", lambda r: RouterHost("active"))
    switching = Switching(restarts=True, rollout=rollout("a"))
    kept = "live traffic: a: ITL p99 50 ms; not rolled back, a keeps serving profile slow"
    assert rolling.take_out_now(SimpleNamespace(name="a"), switching.rollout, switching, "/bin",
                             30000, "/c", kept) is False
    assert seen and seen[0].endswith(kept) and "nothing changed" not in seen[0]
