"""Startup logs as journald and ``docker logs -t`` hand them over read like the raw log.

The wrapped fixtures under tests/fixtures/logs/wrapped/ are COMPOSED by tools/wrap_log.py
from real raw fixtures (each file's header names its raw log and the documented format:
journalctl(1) --output, docker logs --timestamps); read raw, their ranks used to merge into
one ("rank0"): the graph usages summed and a second rank's KV line became a draft pool.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuserve.memory.startup_log import parse_log, read_log

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
WRAPPED = FIXTURES / "logs" / "wrapped"
TP8 = FIXTURES / "sglang_logs" / "startup_pr11716_tp8.log"
GRAPHS = FIXTURES / "logs" / "sglang_pr12978_graph_end_two_ranks.log"
MODES = ["journal-short", "journal-short-precise", "journal-short-iso",
         "journal-short-iso-precise", "docker"]


def _figures(path: Path) -> dict:
    d = read_log(path).to_dict()
    d.pop("source")
    return d


@pytest.mark.parametrize("mode", MODES)
def test_wrapped_tp8_log_equals_raw(mode):
    wrapped = WRAPPED / f"startup_pr11716_tp8.{mode}.log"
    assert _figures(wrapped) == _figures(TP8)
    log = read_log(wrapped)
    assert sorted(log.ranks) == [f"TP{i}" for i in range(8)]
    assert log.ranks["TP7"].load_begin_avail == 137.52
    assert log.pre_load_free == 137.29


@pytest.mark.parametrize("mode", ["journal-short", "docker"])
def test_wrapped_graph_ends_stay_per_rank(mode):
    log = read_log(WRAPPED / f"sglang_pr12978_graph_end_two_ranks.{mode}.log")
    assert _figures(WRAPPED / f"sglang_pr12978_graph_end_two_ranks.{mode}.log") == \
        _figures(GRAPHS)
    assert (log.ranks["TP0"].graph_usage, log.ranks["TP1"].graph_usage) == (1.00, 1.04)
    assert log.graph_usage == 1.04  # the largest rank's, not the 2.04 GiB sum


@pytest.mark.parametrize("prefix", [
    "Oct  6 09:06:10 gpu01 sglang[4242]: ",  # short, day padded with a space
    "Mon 2025-10-06 09:06:10 UTC gpu01 sglang[4242]: ",  # short-full
    "2025-10-06T09:06:10+0000 gpu01 python3[17]: ",  # short-iso, older systemd zone
    "Oct 06 09:06:10 gpu01 sglang: ",  # no pid
    "2025-10-06T09:06:10.123456789+02:00 ",  # docker with a zone offset
])
def test_other_prefix_spellings_keep_the_rank(prefix):
    raw = "[2025-10-06 09:06:10 TP3] Load weight begin. avail mem=137.29 GB"
    assert parse_log(prefix + raw).to_dict() | {"source": ""} == \
        parse_log(raw).to_dict() | {"source": ""}
    assert list(parse_log(prefix + raw).ranks) == ["TP3"]
