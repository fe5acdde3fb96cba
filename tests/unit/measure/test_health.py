"""Health gate: phase classification on real SGLang log lines and the wait/fail decision."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuserve.measure.health import (
    ProbeError,
    Verdict,
    classify,
    decide,
    parse_probe,
    progress_line,
    restart_warning,
)

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "sglang_logs"


def log_lines(name: str) -> list[str]:
    lines = (LOGS / name).read_text().splitlines()
    assert lines[0].startswith("# source: https://"), "fixtures name their source"
    return lines[1:]


@pytest.mark.parametrize(
    ("fixture", "phase"),
    [
        ("startup_pr15426_llama8b.log", "loading_weights"),
        ("startup_pr11716_tp8.log", "loading_weights"),
        ("failure_issue7691_rocm_kv.log", "kv_cache"),
        ("startup_pr11830_kv_graphs.log", "warmup"),
    ],
)
def test_furthest_phase_of_real_logs(fixture: str, phase: str) -> None:
    state = classify(log_lines(fixture))
    assert state.phase.name == phase
    assert not state.failed


def test_phase_advances_line_by_line_through_a_real_start() -> None:
    lines = log_lines("startup_pr15426_llama8b.log")
    seen = [classify(lines[: i + 1]).phase.name for i in range(len(lines))]
    # the log starts before torch distributed init, then initialises, then loads
    assert seen[0] == "starting"
    assert "initialising" in seen
    assert seen.index("initialising") < seen.index("loading_weights")
    kv = log_lines("startup_pr11830_kv_graphs.log")
    assert classify(kv[:2]).phase.name == "kv_cache"
    assert classify(kv[:5]).phase.name == "cuda_graphs"


def test_out_of_order_ranks_do_not_move_the_phase_back() -> None:
    lines = log_lines("startup_pr11830_kv_graphs.log") + log_lines("startup_pr11716_tp8.log")
    assert classify(lines).phase.name == "warmup"


def test_0523_graph_capture_lines() -> None:
    # format strings of sglang 0.5.23, model_executor/model_runner_components/
    # cuda_graph_setup.py, as the 0.5.23 wheel prints them
    begin = "[2026-11-29 10:00:00 TP0] Capture target decode CUDA graph begin. backend=full"
    assert classify([begin]).phase.name == "cuda_graphs"
    sched = "[2026-11-29 10:00:09 TP0] max_total_num_tokens=1049600, chunked_prefill_size=8192"
    assert classify([begin, sched]).phase.name == "warmup"


def test_ready_line_from_http_server() -> None:
    # logged by sglang/srt/entrypoints/http_server.py::_wait_and_warmup after warmup
    lines = ["[2026-11-29 10:00:00] The server is fired up and ready to roll!"]
    assert classify(lines).phase.label == "ready"


def test_most_specific_fatal_line_wins() -> None:
    # SGLang prints the generic scheduler line first, the cause a few lines later
    # (sglang/srt/model_executor/cuda_graph_runner.py: "Capture cuda graph failed: ...")
    lines = ["[2026-11-29 11:29:24 TP0] Scheduler hit an exception: Traceback (most recent "
             "call last):",
             "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate "
             "2.00 GiB.",
             "[2026-11-29 11:29:24] Received sigquit from a child process. It usually means the "
             "child failed."]
    assert classify(lines).fatal_line.startswith("Exception: Capture cuda graph failed")


def test_fatal_line_of_a_real_crash() -> None:
    state = classify(log_lines("failure_pr19781_sigquit.log"))
    assert state.failed
    # the scheduler's exception says more than the SIGQUIT notice printed before it
    assert "Scheduler hit an exception" in state.fatal_line


def probe(**kw) -> dict:
    doc = {
        "health": None,
        "health_error": "refused",
        "unit": {"ActiveState": "active", "SubState": "running", "NRestarts": "0",
                 "ExecMainStatus": "0", "InvocationID": "abc"},
        "lines": [],
        "tail": [],
    }
    doc.update(kw)
    return doc


def test_parse_probe_reads_the_script_document() -> None:
    p = parse_probe(json.dumps(probe(health=503, lines=["a"], tail=["b"])))
    assert (p.health, p.active_state, p.n_restarts, p.lines, p.tail) == (503, "active", 0,
                                                                         ["a"], ["b"])
    with pytest.raises(ProbeError):
        parse_probe("Traceback (most recent call last):")
    # a fact whose command printed nothing comes back as None from pyinfra
    for empty in (None, ""):
        with pytest.raises(ProbeError, match="printed nothing"):
            parse_probe(empty)


def test_decide_waits_reports_phase_then_healthy() -> None:
    lines = log_lines("startup_pr11830_kv_graphs.log")[:5]
    d = decide(parse_probe(json.dumps(probe(health=None, lines=lines))), 30, 600)
    assert d.verdict is Verdict.WAIT
    assert progress_line("gpu1", d, 30) == (
        "gpu1: health: capturing CUDA graphs (30 s, /health no answer)"
    )
    d = decide(parse_probe(json.dumps(probe(health=200))), 31, 600)
    assert d.verdict is Verdict.HEALTHY


def test_decide_fails_early_when_the_unit_dies() -> None:
    unit = {"ActiveState": "activating", "SubState": "auto-restart", "NRestarts": "1",
            "ExecMainStatus": "1"}
    lines = log_lines("failure_pr19781_sigquit.log")
    d = decide(parse_probe(json.dumps(probe(unit=unit, lines=lines))), 5, 600)
    assert d.verdict is Verdict.FAILED
    assert "exit status 1" in d.message and "Scheduler hit an exception" in d.message


def test_decide_fails_on_restart_count_growth_even_if_running_again() -> None:
    unit = {"ActiveState": "active", "SubState": "running", "NRestarts": "3"}
    d = decide(parse_probe(json.dumps(probe(unit=unit))), 5, 600, baseline_restarts=2)
    assert d.verdict is Verdict.FAILED
    d = decide(parse_probe(json.dumps(probe(unit=unit))), 5, 600, baseline_restarts=3)
    assert d.verdict is Verdict.WAIT


def test_decide_fails_on_fatal_line_while_process_still_up() -> None:
    lines = log_lines("failure_pr19781_sigquit.log")
    d = decide(parse_probe(json.dumps(probe(health=None, lines=lines))), 5, 600)
    assert d.verdict is Verdict.FAILED


def test_decide_times_out_with_last_phase() -> None:
    lines = log_lines("startup_pr11716_tp8.log")
    d = decide(parse_probe(json.dumps(probe(health=503, lines=lines))), 601, 600)
    assert d.verdict is Verdict.TIMEOUT
    assert "loading weights" in d.message


def test_200_from_an_inactive_unit_is_not_healthy() -> None:
    unit = {"ActiveState": "inactive", "SubState": "dead", "NRestarts": "0"}
    d = decide(parse_probe(json.dumps(probe(health=200, unit=unit))), 5, 600)
    assert d.verdict is Verdict.FAILED


# systemd 252's own line (Debian 12) after `systemctl kill -s KILL` of the server
KILLED = "gpuserve-sglang.service: Main process exited, code=killed, status=9/KILL"


def test_healthy_after_a_restart_warns_with_the_count_and_the_last_exit() -> None:
    """A server systemd restarted answers /health 200 again; the gate passes, and the
    warning keeps the crash visible (count and how the old process ended)."""
    unit = {"ActiveState": "active", "SubState": "running", "NRestarts": "2"}
    d = decide(parse_probe(json.dumps(probe(health=200, unit=unit, last_exit=KILLED))),
               5, 600, baseline_restarts=2)
    assert d.verdict is Verdict.HEALTHY and d.probe is not None
    assert restart_warning("gpu1", "gpuserve-sglang.service", d.probe) == (
        "gpu1: health: gpuserve-sglang.service was restarted 2 times by systemd since it "
        "was started (last exit: code=killed, status=9/KILL); it serves again, see "
        "journalctl -u gpuserve-sglang.service")


def test_restart_warning_singular_without_a_journal_line_and_none_without_restarts() -> None:
    one = parse_probe(json.dumps(probe(health=200, unit={"ActiveState": "active",
                                                         "NRestarts": "1"})))
    assert one.last_exit is None
    assert restart_warning("gpu1", "u.service", one) == (
        "gpu1: health: u.service was restarted 1 time by systemd since it was started; it "
        "serves again, see journalctl -u u.service")
    exited = parse_probe(json.dumps(probe(health=200, last_exit="u.service: Main process "
                                          "exited, code=exited, status=1/FAILURE")))
    assert exited.n_restarts == 0 and restart_warning("gpu1", "u.service", exited) is None
