"""RDMA parsers against real outputs (tests/fixtures/rdma, each with a .source note)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gpuserve.parsers.common import ParseError
from gpuserve.parsers.rdma import (
    UNCALIBRATED,
    latency_fields,
    parse_ibv_devinfo,
    parse_perftest_bw,
    parse_perftest_lat,
    parse_rdma_link,
    parse_sysfs_rdma,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rdma"


def fixture(name: str) -> str:
    assert (FIXTURES / f"{name}.source").read_text().strip(), f"{name} has no source"
    return (FIXTURES / name).read_text()


def test_every_fixture_names_its_source():
    for sample in FIXTURES.glob("*.txt"):
        assert (FIXTURES / f"{sample.name}.source").read_text().strip(), sample.name


def test_ibv_devinfo_two_hcas_each_port_with_its_state():
    ports = parse_ibv_devinfo(fixture("ibv_devinfo_mlx4_two_hcas.txt"))
    assert [(p.device, p.port, p.state, p.link_layer) for p in ports] == [
        ("mlx4_1", 1, "ACTIVE", "InfiniBand"), ("mlx4_1", 2, "DOWN", "InfiniBand"),
        ("mlx4_0", 1, "ACTIVE", "InfiniBand"), ("mlx4_0", 2, "DOWN", "InfiniBand")]
    assert all(not p.gids for p in ports)  # no -v: no GID table


def test_ibv_devinfo_verbose_soft_roce_gids_and_phys_state():
    (port,) = parse_ibv_devinfo(fixture("ibv_devinfo_v_rxe0.txt"))
    assert (port.device, port.state, port.link_layer, port.phys_state) == (
        "rxe0", "ACTIVE", "Ethernet", "LINK_UP")
    assert [(g.index, g.gid, g.type) for g in port.gids] == [
        (0, "fe80:0000:0000:0000:b208:75ff:fe5f:b85e", None),
        (1, "0000:0000:0000:0000:0000:ffff:0a0b:0bfb", None)]


def test_ibv_devinfo_gid_type_after_comma_composed():
    # composed: newer rdma-core prints "GID[  3]: ::ffff:10.0.0.1, RoCE v2"
    text = "hca_id:\tmlx5_0\n\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n" \
           "\t\t\tGID[  3]:\t\t::ffff:10.0.0.1, RoCE v2\n"
    (port,) = parse_ibv_devinfo(text)
    assert port.gids[0].type == "RoCE v2" and port.gids[0].gid == "::ffff:10.0.0.1"


def test_ibv_devinfo_rejects_other_text():
    with pytest.raises(ParseError):
        parse_ibv_devinfo("No IB devices found\n")


def test_rdma_link_old_layout_with_index_prefix():
    ports = parse_rdma_link(fixture("rdma_link_i40iw_mlx5.txt"))
    assert [(p.device, p.port, p.state, p.phys_state, p.netdev) for p in ports] == [
        ("i40iw0", 1, "DOWN", "NOP", None), ("i40iw1", 1, "ACTIVE", "NOP", None),
        ("mlx5_0", 1, "DOWN", "DISABLED", "ens803f0"),
        ("mlx5_1", 1, "ACTIVE", "LINK_UP", "ens803f1")]


def test_rdma_link_current_layout():
    ports = parse_rdma_link(fixture("rdma_link_gx10_roce.txt"))
    assert [p.device for p in ports] == ["rocep1s0f0", "rocep1s0f1", "roceP2p1s0f0",
                                         "roceP2p1s0f1"]
    assert {p.state for p in ports} == {"ACTIVE"} and ports[2].netdev == "enP2p1s0f0np0"


def test_rdma_link_rejects_garbage():
    with pytest.raises(ParseError, match="line 1"):
        parse_rdma_link("Command \"link\" is unknown\n")


def test_sysfs_ports_gids_types_and_numa():
    roce, ib = parse_sysfs_rdma(fixture("sysfs_ib_grep_composed.txt"))
    assert (roce.device, roce.state, roce.link_layer, roce.phys_state, roce.numa_node) == (
        "mlx5_0", "ACTIVE", "Ethernet", "LinkUp", 0)
    assert [(g.index, g.type) for g in roce.gids] == [
        (0, "IB/RoCE v1"), (1, "RoCE v2"), (2, "IB/RoCE v1"), (3, "RoCE v2")]  # zero dropped
    assert (ib.state, ib.link_layer, ib.numa_node, ib.phys_state) == (
        "DOWN", "InfiniBand", 1, "Disabled")
    assert roce.as_dict()["name"] == "mlx5_0" and roce.as_dict()["port"] == 1


def test_sysfs_unknown_numa_is_none():
    (port,) = parse_sysfs_rdma(["/sys/class/infiniband/rxe0/device/numa_node:-1",
                                "/sys/class/infiniband/rxe0/ports/1/state:4: ACTIVE"])
    assert port.numa_node is None and port.state == "ACTIVE"


def test_ib_write_bw_gbits_row():
    bw = parse_perftest_bw(fixture("ib_write_bw_spark_rocep.txt"))
    assert (bw.device, bw.link_type, bw.size_bytes, bw.iterations) == (
        "rocep1s0f1", "IB", 65536, 20000)
    assert (bw.peak, bw.average, bw.unit, bw.msg_rate_mpps) == (
        111.72, 111.71, "Gb/sec", 0.213070)
    assert bw.average_gbps == 111.71


def test_ib_write_bw_megabytes_converted_composed():
    text = (" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n"
            " 65536      5000           4555.12            4554.89              0.072878\n")
    assert parse_perftest_bw(text).average_gbps == pytest.approx(36.439, abs=1e-3)


def test_ib_write_lat_row():
    lat = parse_perftest_lat(fixture("ib_write_lat_spark_rocep.txt"))
    assert (lat.size_bytes, lat.iterations, lat.t_min, lat.t_avg, lat.p99) == (
        2, 1000, 1.42, 1.47, 1.57)


def test_perftest_without_result_row_is_an_error():
    head = fixture("ib_write_bw_spark_rocep.txt").split(" #bytes")[0]
    with pytest.raises(ParseError):
        parse_perftest_bw(head)
    with pytest.raises(ParseError):
        parse_perftest_lat(head)


def test_soft_roce_sysfs_from_the_lab_vm():
    (port,) = parse_sysfs_rdma(fixture("sysfs_rxe0_lab_vm.txt"))
    assert (port.device, port.state, port.link_layer, port.numa_node) == (
        "rxe0", "ACTIVE", "Ethernet", None)
    assert [(g.index, g.type) for g in port.gids] == [(0, "RoCE v2"), (1, "RoCE v2"),
                                                      (2, "RoCE v2")]
    assert port.gids[1].gid.endswith("ffff:0a00:020f")  # 10.0.2.15, the VM's address


def test_soft_roce_perftest_rows_with_tabs():
    bw = parse_perftest_bw(fixture("ib_write_bw_rxe0_lab_vm.txt"))
    assert (bw.device, bw.link_type, bw.iterations, bw.average, bw.unit) == (
        "rxe0", "Ethernet", 672, 0.12, "Gb/sec")
    lat = parse_perftest_lat(fixture("ib_write_lat_rxe0_lab_vm.txt"))
    assert (lat.t_min, lat.t_avg, lat.p99) == (31.76, 53.43, 508.54)


def test_uncalibrated_clock_row_parses_as_not_finite():
    lat = parse_perftest_lat(fixture("ib_write_lat_rxe0_lab_vm_inf.txt"))
    assert (lat.size_bytes, lat.iterations) == (2, 1000)
    assert math.isinf(lat.t_avg) and math.isinf(lat.p99)
    assert latency_fields(lat) == {"write_lat_us": None, "write_lat_p99_us": None,
                                   "write_lat_note": UNCALIBRATED}
    good = parse_perftest_lat(fixture("ib_write_lat_rxe0_lab_vm.txt"))
    assert latency_fields(good) == {"write_lat_us": 53.43, "write_lat_p99_us": 508.54}
