"""nccl-tests and p2pBandwidthLatencyTest parsers against samples in tests/fixtures/gpuhost."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuserve.parsers.common import ParseError
from gpuserve.parsers.nccl_tests import parse_nccl_tests
from gpuserve.parsers.p2p_bandwidth import off_diagonal, parse_p2p_bandwidth

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gpuhost"


def fixture(name: str) -> str:
    assert (FIXTURES / f"{name}.source").read_text().strip(), f"{name} has no source"
    return (FIXTURES / name).read_text()


# ------------------------------------------------------------------ nccl-tests


def test_nccl_old_header_real():
    result = parse_nccl_tests(fixture("nccl_header_nccl1530.txt"))
    assert result.params["nGpus"] == "8"
    assert result.params["maxBytes"] == "134217728"
    assert result.params["warmup iters"] == "5"
    assert result.params["step"] == "2(factor)"
    assert [r.rank for r in result.ranks] == [0, 1]
    assert result.ranks[1].host == "gpu59"
    assert result.ranks[1].pci == "0x27"
    assert result.ranks[1].name == "NVIDIA GeForce RTX 4090"
    assert result.columns[:5] == ["size", "count", "type", "redop", "root"]
    assert result.columns.count("#wrong") == 2
    assert result.rows == []
    assert not result.ok  # no rows is not a pass


def test_nccl_new_rank_line_real():
    result = parse_nccl_tests(fixture("nccl_rank_line_tinygrad45.txt"))
    (rank,) = result.ranks
    assert rank.host == "i-56butc28zq2jtjaluzq7va7p6"
    assert rank.pci == "0000:2c:00"
    assert rank.device == 0 and rank.pid == 9822


def test_nccl_tail_real():
    result = parse_nccl_tests(fixture("nccl_tail_nccltests119.txt"))
    assert len(result.rows) == 2
    row = result.rows[0]
    assert (row.size, row.count, row.type, row.redop, row.root) == (
        132120584, 33030146, "float", "sum", -1,
    )
    assert row.out_of_place.time_us == pytest.approx(2644.1)
    assert row.out_of_place.busbw == pytest.approx(95.77)
    assert row.in_place.algbw == pytest.approx(50.45)
    assert row.in_place.wrong == 0
    assert result.out_of_bounds == 0
    assert result.avg_busbw == pytest.approx(84.8558)
    assert result.bw_check is None
    assert result.ok


def test_nccl_mpirun_prefix_info_lines_na_and_failed_check_composed():
    result = parse_nccl_tests(fixture("nccl_full_mpirun_composed.txt"))
    assert result.version == "2.17.6"
    assert result.collective == "all_reduce_perf"
    assert result.concluded
    assert result.params["unalign"] == "0"
    assert len(result.ranks) == 2
    assert [r.size for r in result.rows] == [1048576, 2097152, 4194304]
    assert result.rows[1].out_of_place.wrong is None  # N/A
    assert result.rows[2].in_place.busbw == pytest.approx(13.71)
    assert result.avg_busbw == pytest.approx(12.9433)
    assert result.bw_check == "FAILED"
    assert result.wrong_total == 0
    assert not result.ok  # the NCCL_TESTS_MIN_BW check failed


def test_nccl_wrong_values_fail():
    text = fixture("nccl_tail_nccltests119.txt").replace("95.74      0", "95.74      3")
    result = parse_nccl_tests(text)
    assert result.wrong_total == 3
    assert not result.ok


def test_nccl_extra_columns_from_header():
    # Composed: -C 1 (cputime) header and a row; column names come from the header.
    text = (
        "#       size         count      type   redop    root  cputime   algbw   busbw #wrong"
        "  cputime   algbw   busbw #wrong\n"
        "           8             2     float     sum      -1    11.37    0.00    0.00      0"
        "    10.93    0.00    0.00      0\n"
    )
    (row,) = parse_nccl_tests(text).rows
    assert row.out_of_place.time_us == pytest.approx(11.37)
    assert row.in_place.time_us == pytest.approx(10.93)


@pytest.mark.parametrize(
    ("text", "line_no"),
    [
        ("# Avg bus bandwidth    : 1.0\n   1024   256   float   sum   -1   1.0   2.0\n", 2),
        ("   1024   256   float   sum   -1   a   1   1   0   1   1   1   0\n", 1),
        ("   1024   256   float   sum   -1   1   1   1   -2   1   1   1   0\n", 1),
    ],
)
def test_nccl_garbage_row_names_the_line(text, line_no):
    with pytest.raises(ParseError) as err:
        parse_nccl_tests(text)
    assert err.value.line_no == line_no


def test_nccl_not_nccl_output():
    with pytest.raises(ParseError):
        parse_nccl_tests("bash: all_reduce_perf: command not found\n")


# ------------------------------------------------------- p2pBandwidthLatencyTest


def test_p2p_bandwidth_real_first_sections():
    report = parse_p2p_bandwidth(fixture("p2p_bw_tinygrad44.txt"))
    assert [d.name for d in report.devices] == ["NVIDIA GeForce RTX 4090"] * 2
    assert report.devices[1].pci_bus_id == 0x17  # printed with %x
    assert report.peer_access == {"0->1": True, "1->0": True}
    assert report.connectivity == [[1, 1], [1, 1]]
    assert report.matrices["unidirectional_disabled"] == [[1008.06, 6.34], [6.34, 926.75]]
    assert off_diagonal(report.matrices["unidirectional_disabled"]) == [6.34, 6.34]


def test_p2p_latency_real_first_rows():
    report = parse_p2p_bandwidth(fixture("p2p_latency_nccl1127.txt"))
    gpu = report.matrices["latency_disabled_gpu"]
    assert len(gpu) == 2 and len(gpu[0]) == 8
    assert gpu[0][1] == 15.33 and gpu[1][0] == 20.72


def test_p2p_full_run_all_sections_composed():
    report = parse_p2p_bandwidth(fixture("p2p_bw_full_composed.txt"))
    assert report.peer_access == {"0->1": False, "1->0": False}
    assert report.connectivity == [[1, 0], [0, 1]]
    assert sorted(report.matrices) == sorted(
        [
            "unidirectional_disabled",
            "unidirectional_enabled_writes",
            "unidirectional_enabled_reads",
            "bidirectional_disabled",
            "bidirectional_enabled",
            "latency_disabled_gpu",
            "latency_disabled_cpu",
            "latency_enabled_writes_gpu",
            "latency_enabled_writes_cpu",
            "latency_enabled_reads_gpu",
            "latency_enabled_reads_cpu",
        ]
    )
    assert report.matrices["latency_enabled_writes_cpu"] == [[2.31, 8.55], [8.47, 2.30]]
    assert report.matrices["bidirectional_enabled"][0][1] == 28.10


def test_p2p_old_layout_composed():
    report = parse_p2p_bandwidth(fixture("p2p_bw_old_layout_composed.txt"))
    assert report.devices[0].pci_bus_id == 0x1A
    assert report.matrices["unidirectional_enabled"][0][1] == 24.22
    assert report.matrices["latency_enabled_gpu"] == [[1.85, 1.62], [1.60, 1.84]]
    assert "latency_enabled_cpu" not in report.matrices


@pytest.mark.parametrize(
    ("text", "line_no"),
    [
        ("P2P Connectivity Matrix\n     D\\D     0     1\n     0       1\n", 3),
        ("Unidirectional P2P=Disabled Bandwidth Matrix (GB/s)\n   D\\D  0  1\n  0  1.0  x\n", 3),
        ("   D\\D     0      1\n", 1),  # header without a section title
        ("P2P=Disabled Latency Matrix (us)\n   GPU  0  1\n  0  1.0  2.0\n  0  1.0  2.0\n", 4),
    ],
)
def test_p2p_garbage_names_the_line(text, line_no):
    with pytest.raises(ParseError) as err:
        parse_p2p_bandwidth(text)
    assert err.value.line_no == line_no


def test_p2p_not_p2p_output():
    with pytest.raises(ParseError):
        parse_p2p_bandwidth("Segmentation fault (core dumped)\n")


def test_nccl_per_iteration_and_timestamp_columns():
    # Composed from the -I 1 and -S 1 header formats in nccl-tests src/util.cu
    # (writeResultHeader: i_min i_max i_p99 i_cv% per half, trailing "timestamp").
    text = (
        "#       size         count      type   redop    root     time   algbw   busbw #wrong"
        "    i_min    i_max    i_p99    i_cv%     time   algbw   busbw #wrong    i_min"
        "    i_max    i_p99    i_cv%           timestamp\n"
        "     1048576        262144     float     sum      -1    87.52   11.98   11.98      0"
        "    85.10    90.33    90.01     1.52    86.90   12.07   12.07      0    84.95"
        "    89.80    89.70     1.40 2026-11-29 10:59:13\n"
    )
    (row,) = parse_nccl_tests(text).rows
    assert row.out_of_place.extra == {"i_min": 85.10, "i_max": 90.33, "i_p99": 90.01,
                                      "i_cv%": 1.52}
    assert row.in_place.extra["i_cv%"] == 1.40
    assert row.in_place.busbw == 12.07
    assert row.timestamp == "2026-11-29 10:59:13"
