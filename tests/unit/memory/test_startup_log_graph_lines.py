"""CUDA-graph and distributed-init lines of SGLang startup logs (gpuserve.memory.startup_log).

Real lines come from tests/fixtures/logs and tests/fixtures/sglang_logs (each file names
its source in its first line); the one reordered line is composed and says so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuserve.memory.startup_log import parse_log, read_log

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
LLAMA4_LINE = (FIXTURES / "logs" / "sglang_8538_llama4_graph.log").read_text().splitlines()[1]


def test_graph_end_usage_then_avail_real_line():
    log = parse_log(LLAMA4_LINE)
    assert log.graph_usage == pytest.approx(6.19)
    assert log.ranks["TP0"].graph_end_avail == pytest.approx(5.24)


def test_graph_end_avail_before_usage():
    # Composed: the real sglang#8538 line with its two figures swapped, the order other
    # builds print them in ("avail mem=..., mem usage=..." as "Load weight end" does).
    swapped = LLAMA4_LINE.replace(
        "mem usage=6.19 GB. avail mem=5.24 GB.", "avail mem=5.24 GB, mem usage=6.19 GB."
    )
    assert swapped != LLAMA4_LINE
    log = parse_log(swapped)
    assert log.graph_usage == pytest.approx(6.19)
    assert log.ranks["TP0"].graph_end_avail == pytest.approx(5.24)


def test_graph_end_new_format_and_usage_only():
    # 0.5.2x spelling: "Capture target decode CUDA graph end. elapsed=..., mem usage=...,
    # avail mem=..." (as shared/reference/model_configs.md quotes it); and a build printing the
    # usage alone. Composed from the real figures of sglang#8538.
    new = "[2025-07-29 18:14:43 TP0] Capture target decode CUDA graph end. elapsed=19.50 s, "
    log = parse_log(new + "mem usage=6.19 GB, avail mem=5.24 GB.")
    assert (log.graph_usage, log.ranks["TP0"].graph_end_avail) == (6.19, 5.24)
    log = parse_log(LLAMA4_LINE + "\n" + new + "mem usage=1.5 GB.")
    assert log.graph_usage == pytest.approx(6.19 + 1.5)  # decode + another graph, per rank


def test_graph_end_per_rank_real_log():
    log = read_log(FIXTURES / "logs" / "sglang_pr12978_graph_end_two_ranks.log")
    assert log.ranks["TP1"].graph_usage == pytest.approx(1.04)
    assert log.ranks["TP0"].graph_usage == pytest.approx(1.00)
    assert log.graph_usage == pytest.approx(1.04)  # the worst rank
    assert log.errors == []


def test_init_torch_distributed_is_not_an_error():
    path = FIXTURES / "sglang_logs" / "startup_pr11716_tp8.log"
    lines = [line for line in path.read_text().splitlines() if "Init torch distributed" in line]
    assert lines, "fixture lost its Init torch distributed lines"
    log = read_log(path)
    assert not [e for e in log.errors if "Init torch distributed" in e["text"]]
    only_init = parse_log("\n".join(lines))
    assert only_init.errors == []
