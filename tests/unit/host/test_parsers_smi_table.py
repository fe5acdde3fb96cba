"""Plain ``nvidia-smi`` tables and looped ``--query-gpu`` output, on real pastes.

Samples and their sources: tests/fixtures/nvidia_smi/SOURCES.md (one is composed, and
named so).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuserve.parsers.common import ParseError
from gpuserve.parsers.nvidia_smi import parse_query_csv, parse_query_gpu, parse_smi_table

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia_smi"


def sample(name: str) -> str:
    """A sample's text; every sample must be listed in SOURCES.md."""
    assert name in (FIXTURES / "SOURCES.md").read_text(), f"{name} has no source"
    return (FIXTURES / name).read_text()


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
