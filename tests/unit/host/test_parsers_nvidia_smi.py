"""nvidia-smi parsers against verbatim samples (tests/fixtures/gpuhost/*.txt + .source)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuserve.parsers.common import ParseError
from gpuserve.parsers.nvidia_smi import (
    P2PMatrix,
    p2p_verdict,
    parse_p2p_matrix,
    parse_query_csv,
    parse_query_gpu,
    parse_smi_table,
    parse_topo_matrix,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gpuhost"


def fixture(name: str) -> str:
    """A sample's text; every sample must name its source in a .source sidecar."""
    path = FIXTURES / name
    assert (FIXTURES / f"{name}.source").read_text().strip(), f"{name} has no source"
    return path.read_text()


# ------------------------------------------------------------------ --query-gpu


def test_query_index_name_busid_real_line():
    gpus = parse_query_gpu(
        fixture("smi_query_index_name_busid_gardenlinux4556.txt"),
        fields=("index", "name", "pci.bus_id"),
    )
    assert len(gpus) == 1
    assert gpus[0]["index"] == 0
    assert gpus[0]["name"] == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert gpus[0]["bus_id"] == "00000000:03:00.0"
    assert gpus[0]["uuid"] is None and gpus[0]["memory_total_mib"] is None


def test_query_nounits_real_line():
    gpus = parse_query_gpu(
        fixture("smi_query_name_driver_memory_nounits.txt"),
        fields=("name", "driver_version", "memory.total"),
    )
    assert gpus[0]["driver_version"] == "580.126.20"
    assert gpus[0]["memory_total_mib"] == 97887
    assert gpus[0]["index"] == 0  # position when no index column


def test_query_units_real_line_generic_fields():
    fields = ("name", "driver_version", "memory.total", "memory.used", "memory.free", "compute_cap")
    rows = parse_query_csv(fixture("smi_query_workstation_units.txt"), fields)
    assert rows == [
        {
            "name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
            "driver_version": "596.21",
            "memory.total": "97887 MiB",
            "memory.used": "824 MiB",
            "memory.free": "95776 MiB",
            "compute_cap": "12.0",
        }
    ]
    gpus = parse_query_gpu(fixture("smi_query_workstation_units.txt"), fields)
    assert gpus[0]["memory_total_mib"] == 97887
    assert gpus[0]["compute_cap"] == "12.0"


def test_query_header_line_overrides_field_order():
    # The default field order would put "name" second; the header says it is first.
    gpus = parse_query_gpu(fixture("smi_query_header_form.txt"))
    assert len(gpus) == 1
    assert gpus[0]["name"] == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert gpus[0]["driver_version"] == "580.159.03"
    assert gpus[0]["compute_cap"] == "12.0"


def test_query_full_composed_with_placeholders():
    gpus = parse_query_gpu(fixture("smi_query_full_composed.txt"))
    assert [g["index"] for g in gpus] == [0, 1]
    assert gpus[0] == {
        "index": 0,
        "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "uuid": "GPU-75bd273e-6b20-0d22-1b0b-5fbb6fb0025b",
        "bus_id": "00000000:03:00.0",
        "memory_total_mib": 97887,
        "memory_used_mib": 824,
        "driver_version": "580.126.20",
        "compute_cap": "12.0",
        "persistence_mode": "Enabled",
    }
    assert gpus[1]["uuid"] is None
    assert gpus[1]["memory_total_mib"] is None
    assert gpus[1]["compute_cap"] is None
    assert gpus[1]["persistence_mode"] == "Disabled"


def test_query_header_with_units_composed():
    gpus = parse_query_gpu(fixture("smi_query_full_header_units_composed.txt"))
    assert gpus[0]["memory_total_mib"] == 97887
    assert gpus[0]["persistence_mode"] == "Enabled"


@pytest.mark.parametrize(
    ("text", "line_no"),
    [
        # The error nvidia-smi prints without a loaded driver is not CSV for 8 fields.
        (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.",
            1,
        ),
        ("0, a, GPU-1, 00000000:03:00.0, 97887, 0, 580.1, 12.0, Enabled\n"
         "x, a, GPU-1, 00000000:04:00.0, 97887, 0, 580.1, 12.0, Enabled", 2),
        ("0, a, GPU-1, 00000000:03:00.0, lots, 580.1, 12.0, Enabled", 1),
        ("0, a, not-a-uuid, 00000000:03:00.0, 1, 580.1, 12.0, Enabled", 1),
    ],
)
def test_query_garbage_names_the_line(text, line_no):
    with pytest.raises(ParseError) as err:
        parse_query_gpu(text)
    assert err.value.line_no == line_no
    assert f"line {line_no}:" in str(err.value)


def test_query_empty_output_is_no_gpus():
    assert parse_query_gpu("") == []


# ---------------------------------------------------------------------- topo -m


def test_topo_fixture_a_tabs_and_empty_cell():
    topo = parse_topo_matrix(fixture("topo_m_club3090_1229.txt"))
    assert topo.gpus == ["GPU0", "GPU1"]
    assert topo.links == [["X", "PHB"], ["PHB", "X"]]
    assert topo.cpu_affinity == ["0-63", "0-63"]
    assert topo.numa_affinity == ["0", "0"]
    assert topo.gpu_numa_id == [None, None]  # "N/A"
    assert topo.nic_links == {} and topo.nics == {}


def test_topo_fixture_a_with_its_legend():
    text = fixture("topo_m_club3090_1229.txt") + "\nLegend:\n\n" + fixture(
        "topo_m_legend_club3090_1229.txt"
    )
    assert parse_topo_matrix(text).links == [["X", "PHB"], ["PHB", "X"]]


def test_topo_fixture_b_five_gpus_two_sockets():
    topo = parse_topo_matrix(fixture("topo_m_club3090_46.txt"))
    assert topo.gpus == [f"GPU{i}" for i in range(5)]
    assert topo.links[0] == ["X", "SYS", "SYS", "SYS", "SYS"]
    assert topo.links[1][2] == "PHB" and topo.links[1][3] == "NODE"
    assert topo.links[3][4] == "PHB"
    assert all(topo.links[i][i] == "X" for i in range(5))
    assert topo.cpu_affinity[0] == "8-15,24-31"
    assert topo.numa_affinity == ["1", "0", "0", "0", "0"]


def test_topo_fixture_c_no_gpu_numa_id_column():
    topo = parse_topo_matrix(fixture("topo_m_rtx6kpro_15.txt"))
    assert topo.links == [["X", "PHB"], ["PHB", "X"]]
    assert topo.cpu_affinity == ["0-13", "0-13"]
    assert topo.numa_affinity == ["0", "0"]
    assert topo.gpu_numa_id == [None, None]


def test_topo_nic_columns_rows_and_legend_composed():
    topo = parse_topo_matrix(fixture("topo_m_nics_composed.txt"))
    assert topo.links == [["X", "NV18"], ["NV18", "X"]]
    assert topo.nic_links == {"NIC0": ["PIX", "SYS"], "NIC1": ["SYS", "PIX"]}
    assert topo.nics == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}
    assert topo.cpu_affinity == ["0-23,96-119", "24-47,120-143"]
    assert topo.numa_affinity == ["0", "1"]


def test_topo_old_layout_named_nic_and_cpu_affinity_only_composed():
    topo = parse_topo_matrix(fixture("topo_m_old_mlx_composed.txt"))
    assert topo.gpus == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert topo.links[0] == ["X", "PIX", "PHB", "PHB"]
    assert topo.nic_links == {"mlx4_0": ["PHB", "PHB", "PHB", "PHB"]}
    assert topo.cpu_affinity == ["0-9,20-29"] * 4
    assert topo.numa_affinity == [None] * 4


@pytest.mark.parametrize(
    ("text", "line_no"),
    [
        ("GPU0 GPU1\nGPU0 X FOO\nGPU1 PHB X", 2),  # unknown link type
        ("GPU0 GPU1\nGPU0 X\n", 2),  # too few cells
        ("hello world\n", 1),  # no header
        ("GPU0 GPU1\nGPU7 X PHB\n", 2),  # row label not in header
    ],
)
def test_topo_garbage_names_the_line(text, line_no):
    with pytest.raises(ParseError) as err:
        parse_topo_matrix(text)
    assert err.value.line_no == line_no


def test_topo_missing_row_is_an_error():
    with pytest.raises(ParseError, match="GPU1"):
        parse_topo_matrix("\tGPU0\tGPU1\nGPU0\t X \tPHB\n")


# --------------------------------------------------------------------- topo -p2p


def test_p2p_fixture_a_gns():
    m = parse_p2p_matrix(fixture("topo_p2p_club3090_1229.txt"))
    assert m.gpus == ["GPU0", "GPU1"]
    assert m.cells == [["X", "GNS"], ["GNS", "X"]]
    assert p2p_verdict(m) == "none"


def test_p2p_fixture_a_with_its_legend():
    text = fixture("topo_p2p_club3090_1229.txt") + "\nLegend:\n\n" + fixture(
        "topo_p2p_legend_club3090_1229.txt"
    )
    assert parse_p2p_matrix(text).cells == [["X", "GNS"], ["GNS", "X"]]


def test_p2p_spaces_ns_composed():
    m = parse_p2p_matrix(fixture("topo_p2p_ns_spaces_composed.txt"))
    assert len(m.gpus) == 4
    assert {c for row in m.cells for c in row} == {"X", "NS"}
    assert p2p_verdict(m) == "none"


def test_p2p_partial_composed():
    m = parse_p2p_matrix(fixture("topo_p2p_partial_composed.txt"))
    assert m.cells[0] == ["X", "OK", "CNS"]
    assert p2p_verdict(m) == "partial"


def test_verdict_ok_needs_every_pair_in_every_matrix():
    ok = P2PMatrix(gpus=["GPU0", "GPU1"], cells=[["X", "OK"], ["OK", "X"]])
    one_way = P2PMatrix(gpus=["GPU0", "GPU1"], cells=[["X", "OK"], ["CNS", "X"]])
    assert p2p_verdict(ok) == "ok"
    assert p2p_verdict(ok, ok) == "ok"
    assert p2p_verdict(ok, one_way) == "partial"
    assert p2p_verdict(None, ok) == "ok"


def test_verdict_unknown_without_pairs():
    assert p2p_verdict() is None
    assert p2p_verdict(None, None) is None
    assert p2p_verdict(P2PMatrix(gpus=["GPU0"], cells=[["X"]])) is None


@pytest.mark.parametrize(
    ("text", "line_no"),
    [
        ('Option "-p2p" is missing its value.', 1),
        (" \tGPU0\tGPU1\n GPU0\tX\tMAYBE\n GPU1\tOK\tX\n", 2),
        (" \tGPU0\tGPU1\n GPU0\tX\n", 2),
    ],
)
def test_p2p_garbage_names_the_line(text, line_no):
    with pytest.raises(ParseError) as err:
        parse_p2p_matrix(text)
    assert err.value.line_no == line_no


# ------------------------------------------------- real captures on an H200 (2026-12-04)


def test_topo_header_underlined_by_nvidia_smi_580_159():
    # nvidia-smi 580.159.04 wraps the header row in ESC[4m ... ESC[0m even off a
    # terminal: the escapes are dropped, the single GPU and its affinities kept.
    text = fixture("topo_m_h200_single_sgr.txt")
    assert "\x1b[4m" in text
    topo = parse_topo_matrix(text)
    assert topo.gpus == ["GPU0"] and topo.links == [["X"]]
    assert (topo.cpu_affinity, topo.numa_affinity, topo.gpu_numa_id) == (["0-15"], ["0"], [None])


def test_p2p_header_underlined_by_nvidia_smi_580_159():
    m = parse_p2p_matrix(fixture("topo_p2p_r_h200_single_sgr.txt"))
    assert m.gpus == ["GPU0"] and m.cells == [["X"]]


def test_query_h200_with_units_header():
    (gpu,) = parse_query_gpu(fixture("smi_query_h200_580_159.txt"))
    assert gpu["name"] == "NVIDIA H200" and gpu["memory_total_mib"] == 143771
    assert gpu["driver_version"] == "580.159.04" and gpu["compute_cap"] == "9.0"


# --------------------------------------------------------------------------------------
# Plain ``nvidia-smi`` tables and looped ``--query-gpu`` output, on real pastes.
#
# Samples and their sources: tests/fixtures/nvidia_smi/SOURCES.md (one is composed, and named so).


FIXTURES_TABLE = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia_smi"


def sample(name: str) -> str:
    """A sample's text; every sample must be listed in SOURCES.md."""
    assert name in (FIXTURES_TABLE / "SOURCES.md").read_text(), f"{name} has no source"
    return (FIXTURES_TABLE / name).read_text()


# ------------------------------------------------------------------ plain table


def test_table_h20_580_cuda13():
    table = parse_smi_table(sample("table_h20_580_nvtrust128.txt"))
    assert (table.driver_version, table.cuda_version) == ("580.95.05", "13.0")
    assert [g["index"] for g in table.gpus] == [0, 1]
    first = table.gpus[0]
    assert first["name"] == "NVIDIA H20"
    assert first["bus_id"] == "00000000:01:00.0"
    assert first["persistence_mode"] == "Enabled"  # the query's spelling of "On"
    assert (first["memory_used_mib"], first["memory_total_mib"]) == (0, 97871)
    assert first["driver_version"] == "580.95.05"
    assert first["uuid"] is None and first["compute_cap"] is None  # not in the table


def test_table_r610_kmd_banner():
    # R610 renamed the banner fields: "KMD Version" / "CUDA UMD Version".
    table = parse_smi_table(sample("table_b200_610_kmd_sglang27487.txt"))
    assert (table.driver_version, table.cuda_version) == ("610.43.02", "13.3")
    assert [g["bus_id"] for g in table.gpus] == ["00000000:63:00.0", "00000000:68:00.0"]
    assert all(g["memory_total_mib"] == 183359 for g in table.gpus)


def test_table_persistence_off_display_on_prompt_line():
    table = parse_smi_table(sample("table_rtx4070_550_nvidiaall212.txt"))
    (gpu,) = table.gpus
    assert gpu["name"] == "NVIDIA GeForce RTX 4070"
    assert gpu["persistence_mode"] == "Disabled"
    assert gpu["bus_id"] == "00000000:2D:00.0"
    assert (gpu["memory_used_mib"], gpu["memory_total_mib"]) == (430, 12282)


def test_table_old_layout_truncated_name_and_processes_section():
    table = parse_smi_table(sample("table_v100_525_old_layout_wan5.txt"))
    assert (table.driver_version, table.cuda_version) == ("525.105.17", "12.0")
    (gpu,) = table.gpus
    assert gpu["name"] == "Tesla V100-SXM2..."  # cut by nvidia-smi, kept as printed
    assert gpu["persistence_mode"] == "Enabled"
    assert (gpu["memory_used_mib"], gpu["memory_total_mib"]) == (308, 32768)


def test_table_looped_paste_keeps_each_gpu_once_with_last_sample():
    # Composed: the real H20 table twice, as `nvidia-smi -l 1` prints it, with the second
    # sample's GPU 0 memory edited to tell the samples apart.
    first = sample("table_h20_580_nvtrust128.txt")
    second = first.replace("      0MiB /  97871MiB", "   1234MiB /  97871MiB", 1)
    table = parse_smi_table(first + second)
    assert [g["index"] for g in table.gpus] == [0, 1]
    assert table.gpus[0]["memory_used_mib"] == 1234


def test_table_refuses_other_text():
    with pytest.raises(ParseError, match="banner"):
        parse_smi_table(sample("query_two_runs_header_bpytop26.txt"))
    banner_only = sample("table_v100_525_old_layout_wan5.txt").splitlines()[:7]
    with pytest.raises(ParseError, match="no GPU rows"):
        parse_smi_table(banner_only)


# ------------------------------------------------------------------ looped query


def test_query_looped_one_gpu_counts_once():
    # Composed: one real line repeated, as `-l 1` prints it for one GPU over 3 s.
    text = sample("query_looped_composed_from_gardenlinux4556.txt")
    assert len(text.splitlines()) == 3
    gpus = parse_query_gpu(text, fields=("index", "name", "pci.bus_id"))
    assert len(gpus) == 1
    assert gpus[0]["bus_id"] == "00000000:03:00.0"


def test_query_looped_keeps_last_sample_by_uuid():
    # Composed from the H20 figures above in the facts' own query order, two samples.
    line = "0, NVIDIA H20, GPU-1, 00000000:01:00.0, 97871, {used}, 580.95.05, 9.0, Enabled"
    text = "\n".join(line.format(used=u) for u in (0, 512))
    gpus = parse_query_gpu(text)
    assert len(gpus) == 1 and gpus[0]["memory_used_mib"] == 512


def test_query_repeated_header_real_paste_is_not_a_gpu():
    # Real: two runs pasted together; the second header used to be read as a GPU row.
    text = sample("query_two_runs_header_bpytop26.txt")
    assert len(parse_query_csv(text)) == 2
    gpus = parse_query_gpu(text)
    assert [g["name"] for g in gpus] == ["GeForce GTX 1080 Ti", "GeForce GTX 1060 6GB"]
    assert [g["memory_total_mib"] for g in gpus] == [11175, 6078]


def test_query_repeated_samples_without_identity_are_refused():
    # Composed: the real first run of the bpytop paste, twice (header included). With no
    # index/uuid/bus id column, 4 rows could be 4 GPUs or 2 sampled twice.
    run = "\n".join(sample("query_two_runs_header_bpytop26.txt").splitlines()[:3])
    with pytest.raises(ParseError, match="looped"):
        parse_query_gpu(run + "\n" + run)


def test_query_two_hosts_with_same_index_are_refused():
    text = "0, GPU-a, 00000000:01:00.0\n0, GPU-b, 00000000:01:00.0"
    with pytest.raises(ParseError, match="index 0"):
        parse_query_gpu(text, fields=("index", "uuid", "pci.bus_id"))
