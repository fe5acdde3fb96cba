"""NCCL all-reduce across the hosts of a group (gpuserve/measure/nccl_nodes.py): the MPI
launch and its environment from the hosts' records, and the gate on a real two-node
all_reduce_perf output (tests/fixtures/gates/all_reduce_h200x16_two_nodes_oci.txt, its
source beside it)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from gpuserve.errors import InputError
from gpuserve.measure import nccl_nodes
from gpuserve.measure.gates import GateStatus
from gpuserve.parsers.nccl_tests import parse_nccl_tests

FIXTURE = (Path(__file__).resolve().parents[2] / "fixtures" / "gates"
           / "all_reduce_h200x16_two_nodes_oci.txt")


def _ports(rate: float | None, count: int = 8) -> tuple[dict, ...]:
    return tuple({"name": f"mlx5_{i}", "port": 1, "state": "ACTIVE", "rate_gbps": rate}
                 for i in range(count)) + ({"name": "mlx5_9", "port": 1, "state": "DOWN",
                                            "rate_gbps": rate},)


def _hosts(rate: float | None = 400.0, gpus: int = 8) -> list[nccl_nodes.NodeHost]:
    return [nccl_nodes.NodeHost("GPU-6550", "10.0.0.1", gpus, _ports(rate)),
            nccl_nodes.NodeHost("GPU-3841", "10.0.0.2", 8, _ports(rate))]


def test_env_from_the_record_and_the_launch_over_every_host():
    hosts = _hosts()
    env = nccl_nodes.nccl_env(hosts[0], "ens1f0")
    assert env == {"NCCL_IB_HCA": "=" + ",".join(f"mlx5_{i}" for i in range(8)),
                   "NCCL_SOCKET_IFNAME": "ens1f0"}  # the DOWN port is left out
    words = shlex.split(nccl_nodes.mpirun_command(hosts, env, "/opt/nccl-tests/"
                                                  "all_reduce_perf", 600, "inv.py"))
    assert words[:3] == ["timeout", "600", "mpirun"]
    assert words[words.index("-np") + 1] == "16"
    assert words[words.index("-H") + 1] == "10.0.0.1:8,10.0.0.2:8"
    assert f"NCCL_IB_HCA={env['NCCL_IB_HCA']}" in words
    assert words[words.index("btl_tcp_if_include") + 1] == "ens1f0"
    assert words[-9:] == ["/opt/nccl-tests/all_reduce_perf", "-b", "8", "-e",
                          str(nccl_nodes.SIZE_BYTES), "-f", "2", "-g", "1"]
    assert nccl_nodes.nccl_env(nccl_nodes.NodeHost("x", "x", 8, ()), None) == {}


def test_launch_refuses_one_host_or_uneven_gpus():
    with pytest.raises(InputError, match="inv.py.*two hosts"):
        nccl_nodes.mpirun_command(_hosts()[:1], {}, "all_reduce_perf", 600, "inv.py")
    with pytest.raises(InputError, match="GPU-6550: 4, GPU-3841: 8"):
        nccl_nodes.mpirun_command(_hosts(gpus=4), {}, "all_reduce_perf", 600, "inv.py")


def test_real_two_node_output_gated():
    result = parse_nccl_tests(FIXTURE.read_text())
    assert {r.host for r in result.ranks} == {"GPU-6550", "GPU-3841"}
    # 8 x 400 Gb/s a host: 400 GB/s, floor 200; the lower half at 4 GiB is 480.53
    ranks, bw = nccl_nodes.judge_across(result, _hosts(), 0.5)
    assert ranks.status == GateStatus.PASS and ranks.measured == 16
    assert bw.status == GateStatus.BASELINE and bw.measured == 480.53 and bw.limit == 200.0
    # a floor above the figure fails, naming it; a baseline 20 % above it too
    [_, low] = nccl_nodes.judge_across(result, _hosts(rate=1600.0), 0.5)
    assert low.status == GateStatus.FAIL and "below the floor 800" in low.message
    [_, drift] = nccl_nodes.judge_across(result, _hosts(), 0.5, baseline=620.0)
    assert drift.status == GateStatus.FAIL
    # no recorded link rate: no floor, the baseline alone
    assert nccl_nodes.floor_gbs(_hosts(rate=None), 0.5) is None


def test_a_missing_host_fails_the_ranks_check():
    text = "\n".join(line for line in FIXTURE.read_text().splitlines()
                     if "GPU-3841" not in line)
    ranks, _ = nccl_nodes.judge_across(parse_nccl_tests(text), _hosts(), 0.5)
    assert ranks.status == GateStatus.FAIL and "8 of 16 GPUs on 1 of 2 hosts" in ranks.message
