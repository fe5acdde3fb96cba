"""Multi-node launches: rank and dist-init address from the inventory group,
the NCCL/Gloo socket interface from host data, and every bad group refused before any
host changes, naming the inventory file and field. Through plan_serve, as the deploy
calls it, and the flags checked by the 0.5.23 catalog like every other flag."""

from __future__ import annotations

from pathlib import Path

import pytest
from systemd_words import server_argv

from gpuserve.errors import InputError
from gpuserve.fleet.multinode import Member, place_node
from gpuserve.launch.lock_choice import HostRuntime
from gpuserve.launch.profiles import load_profile
from tests.serve_plans import plan_of

REPO = Path(__file__).resolve().parents[3]
TWO = REPO / "tests/fixtures/profiles/two-nodes.yaml"
INV = "inventory/gpu.py"
GROUP = [Member("gpu-a", {"private_address": "10.0.0.21", "nccl_socket_ifname": "ens5f0"}),
         Member("gpu-b", {"private_address": "10.0.0.22", "nccl_socket_ifname": "ens5f1"})]


def runtime(home: str) -> HostRuntime:
    return HostRuntime(name="gpu-b", python="3.11.2", glibc="2.36", driver="580.126.20",
                       cuda_toolkit="13.0", free_bytes=500 * 1024**3, gpus=8)


def plan(host: str = "gpu-b", group=GROUP, **data):
    members = {"pair": group}
    host_data = {"profile": str(TWO), "sglang_nodes_group": "pair", "preflight": "off",
                 **next((m.data for m in group if m.name == host), {}), **data}
    return plan_of(host_data, INV, runtime, host_name=host, group_members=members.get)


def value(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def launched(p) -> list[str]:
    return server_argv(p.service.unit_text, p.service.env_text)


def test_rank_follows_the_group_order_and_node_0_is_the_head() -> None:
    for host, rank in (("gpu-a", "0"), ("gpu-b", "1")):
        p = plan(host)
        args = launched(p)
        assert value(args, "--nnodes") == "2"
        assert value(args, "--dist-init-addr") == "10.0.0.21:20000"
        assert p.node is not None and p.node.head == "gpu-a"
        assert p.node.is_head == (rank == "0")
        # SGLang's own default (0) renders nothing, so rank 0 carries no --node-rank
        assert value(args, "--node-rank") == (None if rank == "0" else rank)


def test_socket_interface_goes_to_nccl_and_gloo_in_the_env_file() -> None:
    env = plan("gpu-b").service.env_text
    assert "NCCL_SOCKET_IFNAME=ens5f1" in env and "GLOO_SOCKET_IFNAME=ens5f1" in env


def test_single_node_profile_has_no_placement_and_no_group_needed() -> None:
    p = plan_of({"profile": "glm5-nvfp4-tp8", "preflight": "off"}, INV, runtime)
    assert p.node is None and "--nnodes" not in launched(p)


def test_ipv6_head_is_bracketed() -> None:
    group = [Member("a", {"private_address": "fd00::21"}),
             Member("b", {"private_address": "fd00::22"})]
    node = place_node(nnodes=2, dist_init_port=20000, profile_source="p.yaml",
                      group="pair", members=group, host_name="b", source=INV)
    assert node.dist_init_addr == "[fd00::21]:20000" and node.rank == 1 and node.env == {}


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"sglang_nodes_group": None}, "sglang_nodes_group", "runs on 2 nodes"),
    ({"sglang_nodes_group": "nowhere"}, "sglang_nodes_group", "no inventory group 'nowhere'"),
    ({"group": GROUP[:1]}, "sglang_nodes_group", "has 1 host(s)"),
    ({"group": [*GROUP, Member("gpu-c", {"private_address": "10.0.0.23"})]},
     "sglang_nodes_group", "has 3 host(s)"),
    ({"group": [GROUP[0], Member("gpu-b", {"private_address": "10.0.0.21"})]},
     "private_address (host gpu-b)", "also host gpu-a's"),
    ({"group": [GROUP[0], Member("gpu-b", {})]}, "private_address (host gpu-b)", "required"),
    ({"group": [GROUP[0], Member("gpu-b", {"private_address": "127.0.0.1"})]},
     "private_address (host gpu-b)", "cannot be reached"),
    ({"group": [GROUP[0], Member("gpu-b", {"private_address": "gpu-b.lan"})]},
     "private_address (host gpu-b)", "not an IP address"),
    ({"group": [GROUP[0], Member("gpu-b", {"private_address": "10.0.0.22",
                                           "nccl_socket_ifname": "eth0; rm -rf /"})]},
     "nccl_socket_ifname (host gpu-b)", "not one network interface name"),
])
def test_bad_groups_are_refused_naming_file_and_field(change, field, words) -> None:
    group = change.pop("group", GROUP)
    with pytest.raises(InputError) as err:
        plan("gpu-b", group, **change)
    assert (err.value.file, err.value.field) == (INV, field)
    assert words in err.value.message


def test_host_outside_its_group_is_refused() -> None:
    with pytest.raises(InputError, match="host gpu-z is not in group 'pair'"):
        place_node(nnodes=2, dist_init_port=20000, profile_source="p.yaml",
                   group="pair", members=GROUP, host_name="gpu-z", source=INV)


@pytest.mark.parametrize(("text", "field", "words"), [
    ("parallel:\n  node_rank: 1\n", "parallel.node_rank", "set by gpuserve"),
    ("parallel:\n  dist_init_addr: 10.0.0.1:20000\n", "parallel.dist_init_addr",
     "set by gpuserve"),
    ("parallel:\n  dist_init_port: 30000\n", "parallel.dist_init_port", "also server.port"),
    ("parallel:\n  dist_init_port: 70000\n", "parallel.dist_init_port", "1..65535"),
])
def test_profile_sets_only_node_count_and_port(tmp_path, text, field, words) -> None:
    bad = tmp_path / "bad-nodes.yaml"
    bad.write_text(f"extends: {TWO}\n{text}")
    with pytest.raises(InputError) as err:
        load_profile(bad)
    assert err.value.field == field and words in err.value.message
    assert err.value.file == str(bad)
