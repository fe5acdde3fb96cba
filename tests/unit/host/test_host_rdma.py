"""RDMA decisions of the host deploy (gpuserve/host/rdma.py) and the fact's parse: the
packages per distribution, GPUDirect (dma-buf vs nvidia-peermem), the host data key,
the record host.json carries and the PD path reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuserve.errors import InputError
from gpuserve.facts.rdma import RDMA_COMMAND, parse_rdma_fact
from gpuserve.fleet.disaggregation import rdma_devices
from gpuserve.host import nccl_env
from gpuserve.host import rdma as rdma_host
from gpuserve.parsers.sections import marker
from gpuserve.plans.host import plan_host

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rdma"


def test_packages_per_distribution_and_unknown_refused():
    assert rdma_host.packages("debian") == ("rdma-core", "ibverbs-utils", "perftest",
                                            "infiniband-diags")
    assert rdma_host.packages("Ubuntu") == rdma_host.packages("debian")
    with pytest.raises(ValueError, match="rocky"):
        rdma_host.packages("rocky")


@pytest.mark.parametrize("flavour,branch,kernel,method", [
    ("open", 580, "6.8.0-45-generic", "dmabuf"),
    ("open", 580, "5.10.0-28-amd64", "nvidia-peermem"),   # kernel before 5.12
    ("proprietary", 580, "6.8.0-45-generic", "nvidia-peermem"),
    ("open", 510, "6.8.0", "nvidia-peermem"),               # branch before dma-buf
    ("proprietary", 460, "6.1.0", None),
])
def test_gpudirect_choice(flavour, branch, kernel, method):
    choice = rdma_host.gpudirect(flavour, branch, kernel)
    assert choice.method == method and choice.reason


def test_host_data_key_validated_before_anything():
    assert plan_host({}, "inv.py").rdma == "auto"
    assert plan_host({"rdma": False}, "inv.py").rdma == "off"
    with pytest.raises(InputError, match="inv.py.*rdma"):
        plan_host({"rdma": "sometimes"}, "inv.py")


def test_wanted_only_with_devices_or_asked():
    assert not rdma_host.wanted("auto", [])
    assert rdma_host.wanted("on", [])
    assert not rdma_host.wanted("off", ["port"])  # type: ignore[list-item]


def test_fact_parse_joins_netdevs_and_gpu_numa():
    sysfs = (FIXTURES / "sysfs_ib_grep_composed.txt").read_text().splitlines()
    out = [marker("ib"), *sysfs, marker("gpu_numa"),
           "/sys/bus/pci/drivers/nvidia/0000:18:00.0/numa_node:0",
           "/sys/bus/pci/drivers/nvidia/0000:9a:00.0/numa_node:-1",
           marker("link"), "link mlx5_0/1 state ACTIVE physical_state LINK_UP netdev ens1np0",
           marker("peermem"), marker("kernel"), "6.8.0-45-generic"]
    fact = parse_rdma_fact(out)
    assert [p.netdev for p in fact["ports"]] == ["ens1np0", None]
    assert fact["gpu_numa"] == [0, None] and fact["kernel"] == "6.8.0-45-generic"
    assert fact["peermem_loaded"] is False
    assert "grep -H ." in RDMA_COMMAND and "head -n" in RDMA_COMMAND


def test_fact_without_sections_is_an_error():
    with pytest.raises(ValueError):
        parse_rdma_fact(["mlx5_0"])


def test_host_json_record_is_what_the_pd_path_reads():
    sysfs = (FIXTURES / "sysfs_ib_grep_composed.txt").read_text()
    from gpuserve.parsers.rdma import parse_sysfs_rdma

    record = rdma_host.record(parse_sysfs_rdma(sysfs), [0],
                              rdma_host.gpudirect("open", 580, "6.8.0"))
    plan = nccl_env.NcclPlan(rdma=record)
    text = nccl_env.host_json(plan)
    assert json.loads(text)["rdma"]["gpudirect"]["method"] == "dmabuf"
    assert rdma_devices(text.splitlines(), "host.json") == ("mlx5_0",)  # the ACTIVE one
    assert "rdma" not in json.loads(nccl_env.host_json(nccl_env.NcclPlan()))


def test_loopback_script_uses_the_roce_v2_gid_and_bounds_each_tool():
    from gpuserve.parsers.rdma import parse_sysfs_rdma

    roce, ib = [p.as_dict() for p in parse_sysfs_rdma(
        (FIXTURES / "sysfs_ib_grep_composed.txt").read_text())]
    script = rdma_host.loopback_script(roce, 3)
    assert "ib_write_bw -d mlx5_0 -i 1 -x 3 -F -D 3 --report_gbits" in script
    assert "ib_write_lat -d mlx5_0 -i 1 -x 3 -F -n 1000" in script
    assert script.count("timeout 33 ") == 4 and "127.0.0.1" in script
    assert " -x " not in rdma_host.loopback_script(ib, 3)  # InfiniBand: LID, no GID index


def test_loopback_result_from_real_perftest_outputs():
    bw = (FIXTURES / "ib_write_bw_spark_rocep.txt").read_text()
    lat = (FIXTURES / "ib_write_lat_spark_rocep.txt").read_text()
    out = "\n".join([marker("bw"), bw, marker("lat"), lat])
    result = rdma_host.loopback_result({"name": "rocep1s0f1", "port": 1}, out)
    assert result == {"name": "rocep1s0f1", "port": 1, "write_bw_gbps": 111.71,
                      "write_bw_size": 65536, "write_lat_us": 1.47, "write_lat_p99_us": 1.57}


def test_loopback_keeps_the_bandwidth_where_perftest_printed_inf_latency():
    """perftest's clock not calibrated (the lab VM under load): the bandwidth is a
    figure, the latency is none, and the record and the log say why."""
    bw = (FIXTURES / "ib_write_bw_rxe0_lab_vm.txt").read_text()
    lat = (FIXTURES / "ib_write_lat_rxe0_lab_vm_inf.txt").read_text()
    out = "\n".join([marker("bw"), bw, marker("lat"), lat])
    result = rdma_host.loopback_result({"name": "rxe0", "port": 1}, out)
    assert "error" not in result and result["write_bw_gbps"] == 0.12
    assert result["write_lat_us"] is None and "did not calibrate" in result["write_lat_note"]
    json.dumps(result, allow_nan=False)  # what the host record can hold
    assert rdma_host.figures(result).startswith("write 0.12 Gb/s, latency: perftest printed inf")


def test_loopback_failure_names_the_tool_text():
    out = "\n".join([marker("bw"), " Couldn't connect to 127.0.0.1:18515", marker("lat")])
    result = rdma_host.loopback_result({"name": "rxe0", "port": 1}, out)
    assert "Couldn't connect" in result["error"]


def test_loopback_seconds_validated():
    assert plan_host({"rdma_loopback": 5}, "inv.py").rdma_loopback == 5
    for bad in (-1, 61, True, "5"):
        with pytest.raises(InputError, match="rdma_loopback"):
            plan_host({"rdma_loopback": bad}, "inv.py")
