"""RDMA doctor rules on host.json's rdma block as roles/rdma records it: a port down, a
RoCE port without a RoCE v2 GID, a NIC on another NUMA node than the GPUs, a PD profile
on a host without an active RDMA port. Ports come from the real parsers over the
fixtures in tests/fixtures/rdma (each with its source)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from gpuserve.doctor.rules import diagnose
from gpuserve.host import rdma as rdma_host
from gpuserve.host.hostfacts import HostFacts
from gpuserve.launch.profiles import load_profile
from gpuserve.parsers.rdma import parse_ibv_devinfo, parse_sysfs_rdma

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
PROFILE = "qwen3-235b-a22b-fp8-h200-tp8"
PD = FIXTURES / "profiles" / "pd-glm5.yaml"
RDMA_IDS = {"rdma-port-down", "rdma-no-roce-v2-gid", "rdma-numa-mismatch", "pd-without-rdma"}


def _facts(rdma: dict | None) -> HostFacts:
    doc = copy.deepcopy(json.loads((FIXTURES / "hostfacts" / "h200-nvlink.json").read_text()))
    if rdma is not None:
        doc["rdma"] = json.loads(json.dumps(rdma))  # as host.json holds it
    return HostFacts.from_dict(doc, "h200-nvlink.json")


def _sysfs_record(gpu_numa: list[int]) -> dict:
    ports = parse_sysfs_rdma((FIXTURES / "rdma" / "sysfs_ib_grep_composed.txt").read_text())
    return rdma_host.record(ports, gpu_numa, rdma_host.GpuDirect("dmabuf", "test"))


def _findings(profile, rdma: dict | None) -> dict[str, str]:
    return {f.id: json.dumps(f.to_dict()) for f in diagnose(profile, _facts(rdma))
            if f.id in RDMA_IDS}


def test_port_down_and_numa_mismatch_named_with_their_evidence():
    found = _findings(load_profile(PROFILE), _sysfs_record(gpu_numa=[1]))
    assert set(found) == {"rdma-port-down", "rdma-numa-mismatch"}
    assert "mlx5_1/1 is DOWN" in found["rdma-port-down"]
    assert "mlx5_0/1 is on NUMA node 0" in found["rdma-numa-mismatch"]


def test_same_numa_node_and_roce_v2_present_are_silent_but_the_down_port():
    found = _findings(load_profile(PROFILE), _sysfs_record(gpu_numa=[0, 1]))
    assert set(found) == {"rdma-port-down"}


def test_roce_port_without_v2_gid_fires():
    # rxe0 from ibv_devinfo -v: Ethernet link layer, GIDs printed without a type
    ports = parse_ibv_devinfo((FIXTURES / "rdma" / "ibv_devinfo_v_rxe0.txt").read_text())
    found = _findings(load_profile(PROFILE), rdma_host.record(ports, [], None))
    assert set(found) == {"rdma-no-roce-v2-gid"} and "rxe0/1" in found["rdma-no-roce-v2-gid"]


def test_pd_profile_without_active_port_names_the_tcp_cost():
    down = parse_ibv_devinfo((FIXTURES / "rdma" / "ibv_devinfo_mlx4_two_hcas.txt").read_text())
    only_down = [p for p in down if p.state != "ACTIVE"]
    found = _findings(load_profile(PD), rdma_host.record(only_down, [], None))
    assert "pd-without-rdma" in found
    assert "TCP fallback" in found["pd-without-rdma"] and "GB/s" in found["pd-without-rdma"]
    with_active = _findings(load_profile(PD), rdma_host.record(down, [], None))
    assert "pd-without-rdma" not in with_active and "rdma-port-down" in with_active


def test_no_rdma_record_is_unknown_and_silent():
    assert _findings(load_profile(PD), None) == {}


def test_document_reads_the_block_from_host_json():
    from gpuserve.facts.document import document_from_sections
    from gpuserve.host import nccl_env

    text = nccl_env.host_json(nccl_env.NcclPlan(rdma=_sysfs_record([0])))
    doc = document_from_sections({"host_json": text.splitlines()})
    assert [d["name"] for d in doc["rdma"]["devices"]] == ["mlx5_0", "mlx5_1"]
    facts = HostFacts.from_dict({**doc, "gpus": []}, "doc.json")
    assert facts.rdma is not None and facts.rdma["devices"][1]["state"] == "DOWN"
    no_block = nccl_env.host_json(nccl_env.NcclPlan()).splitlines()
    assert document_from_sections({"host_json": no_block})["rdma"] is None
    assert document_from_sections({})["rdma"] is None
